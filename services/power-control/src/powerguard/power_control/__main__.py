"""`python -m powerguard.power_control --config site.yaml`"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from powerguard.bus import service_main

from . import __doc__ as DESCRIPTION
from .service import main as service


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--instance",
        default=os.environ.get("POWERGUARD_INSTANCE") or socket.gethostname(),
        help="this replica's name in the command ledger (default: the host name)",
    )


def main(argv: list[str] | None = None) -> int:
    return service_main(
        "power-control",
        service,
        description=DESCRIPTION,
        default_port=9103,
        argv=argv,
        extend=_flags,
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
