"""`python -m powerguard.coordinator --config site.yaml`"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from powerguard.bus import service_main

from . import __doc__ as DESCRIPTION
from .policy import Policy
from .service import main as service


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--instance",
        default=os.environ.get("POWERGUARD_INSTANCE") or socket.gethostname(),
        help="this replica's name in the leader lease (default: the host name; a replica restarted "
        "under the same name takes its lease back at once)",
    )


def main(argv: list[str] | None = None) -> int:
    return service_main(
        "coordinator",
        service,
        description=DESCRIPTION,
        default_port=9102,
        argv=argv,
        extend=_flags,
        check=lambda site: site.settings("coordinator", Policy),
    )


if __name__ == "__main__":
    sys.exit(main())
