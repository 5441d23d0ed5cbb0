"""A UPS's output through a site's own command: the last step of an outage longer than the
battery where no network protocol can say it. apcupsd's killpower is the case: it runs on the
host wired to the UPS (USB or serial) and its network server only reads, so a site gives an
argv that reaches that host (``["ssh", "ups-host", "/sbin/apcupsd", "--killpower"]``, or a
script of its own). Run without a shell, in power-control's allowlisted environment (never its
credentials) plus ``POWERGUARD_UPS`` and ``POWERGUARD_DELAY_S``; a non-zero exit is a failure
naming the command and its last line; its last line of output is the result."""

from __future__ import annotations

from ..errors import CommandRejected, SchedulerError
from ..schedulers.base import run
from .base import Guarded


class CommandUpsOutput:
    kind = "command"

    def __init__(self, device: str, guard: Guarded, *, ups: str, argv: list[str]) -> None:
        if not argv or not all(isinstance(a, str) for a in argv):
            raise CommandRejected(f"{device}: control.options.command must be a non-empty list of strings (an argv)")
        self.device, self.guard, self.ups, self.argv = device, guard, ups, argv

    def __repr__(self) -> str:
        return f"CommandUpsOutput({self.device} {self.argv[0]})"

    async def shutdown_return(self, delay_s: float | None = None) -> str:
        delay = max(0, round(delay_s or 0))

        async def go() -> str:
            env = {"POWERGUARD_UPS": self.ups, "POWERGUARD_DELAY_S": str(delay)}
            try:
                out = await run(self.argv, timeout_s=self.guard.timeout_s, env=env, what="the UPS's command")
            except SchedulerError as exc:
                raise CommandRejected(f"{self.device}: {exc}") from None
            lines = out.strip().splitlines()
            return f"{self.argv[0]} ran: {lines[-1] if lines else 'no output'}"

        return await self.guard.call("the UPS's command", go)
