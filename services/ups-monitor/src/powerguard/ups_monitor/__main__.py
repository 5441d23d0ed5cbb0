"""`python -m powerguard.ups_monitor --config site.yaml`"""

from __future__ import annotations

import sys

from powerguard.bus import service_main

from . import __doc__ as DESCRIPTION
from .service import main as service


def main(argv: list[str] | None = None) -> int:
    return service_main(
        "ups-monitor",
        service,
        description=DESCRIPTION,
        default_port=9101,
        argv=argv,
        check=check,
    )


def check(site) -> None:
    """The ups_monitor section and every UPS's driver options are valid before anything connects."""
    from .config import MonitorSettings
    from .service import make_driver

    settings = site.settings("ups_monitor", MonitorSettings)
    for ups in site.ups:
        make_driver(ups, settings)


if __name__ == "__main__":
    sys.exit(main())
