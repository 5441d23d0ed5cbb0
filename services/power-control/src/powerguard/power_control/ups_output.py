"""A UPS's output, as the saga's last step of a long outage asks it (``UpsOutputOffRequested``):
which driver tells which UPS, built from the site file when first needed (its credential read
then, never logged): NUT through upsd, SNMP (UPS-MIB or APC PowerNet), or the site's own
command (``control.options.command``: apcupsd's killpower on the host wired to the UPS); and
the telling itself, refused while a node the UPS feeds reads on (:func:`tell_ups`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Container, Sequence

from powerguard.schemas import SiteConfig, UpsConfig, UpsOutputResult, UpsOutputResultData, secret_value

from .drivers.base import Guarded
from .drivers.ups_command import CommandUpsOutput
from .drivers.ups_nut import DEFAULT_PORT, NutUpsOutput
from .drivers.ups_snmp import UpsMibOutput
from .errors import CommandRejected, CredentialUnavailable

log = logging.getLogger(__name__)


class UpsOutputs:
    def __init__(self, site: SiteConfig, *, timeout_s: float) -> None:
        self._ups: dict[str, UpsConfig] = {u.name: u for u in site.ups}
        self._timeout_s = timeout_s
        self._drivers: dict[str, NutUpsOutput | UpsMibOutput | CommandUpsOutput] = {}

    def __contains__(self, ups: str) -> bool:
        return ups in self._ups

    def driver(self, ups: str) -> NutUpsOutput | UpsMibOutput | CommandUpsOutput:
        """The UPS's output driver; :class:`CommandRejected` naming what the site file lacks."""
        if ups in self._drivers:
            return self._drivers[ups]
        cfg = self._ups[ups]
        device = f"ups:{ups}"
        if cfg.control is None:
            raise CommandRejected(f"{device}: no 'control' credential in the site file: the UPS cannot be told")
        guard = Guarded(device, timeout_s=self._timeout_s)
        if "command" in cfg.control.options:  # the site's own command (apcupsd's killpower on its host)
            self._drivers[ups] = CommandUpsOutput(device, guard, ups=ups, argv=cfg.control.options["command"])
            return self._drivers[ups]
        if cfg.driver == "snmp":
            from powerguard.snmp import SnmpCredentials, auth_data

            try:
                auth = auth_data(SnmpCredentials.model_validate(cfg.control.options))
            except Exception as exc:  # a missing community, an unreadable secret
                raise CredentialUnavailable(f"{device}: control.options: {exc}") from None
            profile = str(cfg.options.get("profile", "auto"))
            self._drivers[ups] = UpsMibOutput(
                device, guard, host=cfg.host, port=cfg.port or 161, auth=auth, profile=profile
            )
            return self._drivers[ups]
        if cfg.driver != "nut":
            raise CommandRejected(
                f"{device}: telling a UPS of driver {cfg.driver} to cut its output and return needs "
                "control.options.command (apcupsd: its --killpower on the host wired to the UPS)"
            )
        try:
            user, password = secret_value(cfg.control.username), secret_value(cfg.control.password)
        except Exception as exc:
            raise CredentialUnavailable(f"{device}: control credential unavailable: {exc}") from None
        if not user or not password:
            raise CredentialUnavailable(f"{device}: control needs username and password (a upsd user)")
        self._drivers[ups] = NutUpsOutput(
            device,
            guard,
            host=cfg.host,
            port=cfg.port or DEFAULT_PORT,
            ups=str(cfg.options.get("ups_name") or cfg.name),
            user=user,
            password=password,
        )
        return self._drivers[ups]


async def tell_ups(d, outputs: UpsOutputs, devices, *, nodes: Container[str], dry_run: bool) -> tuple[bool, str]:
    """Tell the UPS of ``d`` (an ``UpsOutputCommandData``) to cut its output after the delay and
    return with mains, unless a node it feeds reads on now: (told, what the UPS said or why not)."""
    if d.dry_run or dry_run:
        detail = f"dry-run: would tell {d.ups} to cut its output in {d.delay_s:.0f}s and return with mains"
        log.info("%s", detail)
        return True, detail
    on = await nodes_on(d.nodes, devices, nodes)
    if on:
        why = f"not told: {', '.join(on)} on (read now; powered on by hand since its off?)"
        log.error("%s: %s", d.ups, why)
        return False, why
    try:
        detail = await outputs.driver(d.ups).shutdown_return(d.delay_s)
    except Exception as exc:  # a refused credential, upsd down, a bug: reported, never silent
        log.error("telling %s to cut its output failed: %s", d.ups, exc)
        return False, str(exc)
    log.warning("%s: %s (output off in %.0fs, on again when mains returns)", d.ups, detail, d.delay_s)
    return True, detail


async def nodes_on(names: Sequence[str], devices, known: Container[str]) -> list[str]:
    """The nodes of ``names`` whose BMC says they are on now (each read on its own; a node
    whose BMC does not answer was reported off by its saga and counts as off)."""

    async def read(node: str) -> str | None:
        try:
            bmc = devices.bmc(node) if node in known else None
            return node if bmc is not None and await bmc.status() == "on" else None
        except Exception as exc:
            log.warning("%s: power not readable before its UPS is told (%s): taken as reported off", node, exc)
            return None

    return sorted(n for n in await asyncio.gather(*map(read, names)) if n is not None)


def ups_result(
    d, *, ok: bool, started: float, dry_run: bool, detail: str | None = None, error: str | None = None
) -> UpsOutputResult:
    """The ``ups.output_result`` answering ``d``."""
    return UpsOutputResult(
        data=UpsOutputResultData(
            saga_id=d.saga_id,
            ups=d.ups,
            idempotency_key=d.idempotency_key,
            ok=ok,
            detail=detail,
            error=error,
            device=f"ups:{d.ups}",
            duration_s=round(time.monotonic() - started, 3),
            dry_run=d.dry_run or dry_run,
        )
    )
