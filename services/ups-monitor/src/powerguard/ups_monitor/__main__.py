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
    )


if __name__ == "__main__":
    sys.exit(main())
