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
    """The ups_monitor section is valid before anything connects. A UPS whose own options or
    secret are bad does not stop the others: it is reported (log, metric, /readyz) at start."""
    from .config import MonitorSettings

    site.settings("ups_monitor", MonitorSettings)


if __name__ == "__main__":
    sys.exit(main())
