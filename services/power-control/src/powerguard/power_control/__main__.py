"""`python -m powerguard.power_control --config site.yaml`"""

from __future__ import annotations

import sys

from powerguard.bus import service_main

from . import __doc__ as DESCRIPTION
from .service import main as service


def main(argv: list[str] | None = None) -> int:
    return service_main(
        "power-control",
        service,
        description=DESCRIPTION,
        default_port=9103,
        argv=argv,
        check=check,
    )


def check(site) -> None:
    """Every power_control option, driver and adapter option is valid before anything connects."""
    from .drivers import Devices
    from .schedulers import make_scheduler
    from .service import load_settings

    settings = load_settings(site)
    Devices(site, settings)
    make_scheduler(settings.scheduler)


if __name__ == "__main__":
    sys.exit(main())
