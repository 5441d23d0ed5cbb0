"""The operator console: a read-only live web page of the site (UPSes, nodes, jobs, the open
outage, past outages), fed from the bus with the observer credential.

    powerguard console --config site.yaml          # http://127.0.0.1:8080/
"""

from .feed import Feed
from .server import make_app, serve
from .state import ConsoleState, timeline_svg

__all__ = ["ConsoleState", "Feed", "make_app", "serve", "timeline_svg"]
