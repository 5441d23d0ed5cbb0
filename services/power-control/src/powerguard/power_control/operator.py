"""What `powerguard power status|on|off|audit` does, through the same drivers as the service."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass

from powerguard.schemas import SiteConfig

from .drivers import Devices, RestorePolicy
from .errors import PowerControlError
from .service import load_settings

ACTIONS = ("on", "soft_off", "off", "cycle")


@dataclass
class NodeRow:
    node: str
    driver: str
    power: str | None = None
    restore_policy: str | None = None
    outlets: str = ""
    verdict: str = ""
    error: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _devices(site: SiteConfig, dry_run: bool = False) -> Devices:
    return Devices(site, load_settings(site), dry_run=dry_run or None)


def _select(site: SiteConfig, nodes: list[str] | None) -> list[str]:
    names = [n.name for n in site.nodes]
    if not nodes:
        return names
    unknown = [n for n in nodes if n not in names]
    if unknown:
        raise PowerControlError(f"not in the site file: {', '.join(unknown)} (nodes: {', '.join(names)})")
    return nodes


async def _each(site: SiteConfig, nodes: list[str] | None, row, *, dry_run: bool = False) -> list[NodeRow]:
    """``row(devices, node)`` for every selected node, concurrently, then close the devices."""
    devices = _devices(site, dry_run)
    try:
        return list(await asyncio.gather(*(row(devices, n) for n in _select(site, nodes))))
    finally:
        await devices.close()


async def status(site: SiteConfig, nodes: list[str] | None = None) -> list[NodeRow]:
    return await _each(site, nodes, _status_row)


async def _status_row(devices: Devices, node: str) -> NodeRow:
    cfg = devices.node(node)
    row = NodeRow(node=node, driver=cfg.bmc.driver if cfg.bmc else "-")
    try:
        bmc = devices.bmc(node)
        row.power = await bmc.status() if bmc else None
        states = []
        for ref in cfg.outlets:
            states.append(f"{ref.pdu}:{ref.outlet}={await devices.pdu(ref.pdu).outlet_state(ref.outlet)}")
        row.outlets = " ".join(states)
    except PowerControlError as exc:
        row.error = str(exc)
    return row


async def act(site: SiteConfig, nodes: list[str], action: str, *, dry_run: bool = False) -> list[NodeRow]:
    if action not in ACTIONS:
        raise PowerControlError(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")

    async def one(devices: Devices, node: str) -> NodeRow:
        cfg = devices.node(node)
        row = NodeRow(node=node, driver="dry-run" if devices.dry_run else cfg.bmc.driver if cfg.bmc else "-")
        try:
            bmc = devices.bmc(node)
            if bmc is None:
                raise PowerControlError(f"node {node} has no BMC in the site file")
            await getattr(bmc, action)()
            row.power = await bmc.status()
            row.verdict = f"{action} sent"
        except PowerControlError as exc:
            row.error = str(exc)
        return row

    return await _each(site, nodes, one, dry_run=dry_run)


async def audit(site: SiteConfig, nodes: list[str] | None = None, *, fix: bool = False) -> list[NodeRow]:
    """Every BMC's power-restore policy against the site's; ``fix`` sets it where it differs."""

    async def one(devices: Devices, node: str) -> NodeRow:
        want: RestorePolicy = devices.settings.restore_policy
        row = await _status_row(devices, node)
        bmc = devices.bmc(node)
        if bmc is None:
            row.verdict = "no BMC: comes back with its outlet" if devices.node(node).outlets else "no BMC, no outlet"
            return row
        try:
            row.restore_policy = await bmc.restore_policy()
            if row.restore_policy is None:
                row.verdict = "BMC does not report its power-restore policy: check it by hand"
            elif row.restore_policy == want:
                row.verdict = "ok"
            elif fix:
                await bmc.set_restore_policy(want)
                row.restore_policy = await bmc.restore_policy()
                row.verdict = "fixed" if row.restore_policy == want else f"set {want}, reads {row.restore_policy}"
            else:
                row.verdict = f"would not come back by itself ({row.restore_policy}, site wants {want}); --fix sets it"
        except PowerControlError as exc:
            row.error = str(exc)
        return row

    return await _each(site, nodes, one)
