"""``powerguard config check`` beyond the file: NATS reached with each service's own credential
and the stream bootstrapped; each UPS read once, each node's BMC and PDU outlets answering — the
way the services will do it, from this host."""

from __future__ import annotations

import asyncio
from pathlib import Path

from powerguard.bus import Bus, BusNames
from powerguard.bus.env import connection
from powerguard.schemas import PowerGuardError, SiteConfig

from .findings import Finding, ok, problem


async def guarded(what: str, check) -> list[Finding]:
    """A live check whose user-input error (a setting, a secret) is one problem line naming it,
    never a traceback."""
    try:
        return await check
    except PowerGuardError as exc:
        return [problem(what, str(exc))]


# who may read the stream's info, in the order tried
STREAM_READERS = ("coordinator", "power-control", "observer", "operator", "admin")


async def nats(
    site: SiteConfig, creds: dict[str, Path], *, url: str | None, ca: Path | None, timeout_s: float
) -> list[Finding]:
    """Connect as each party in ``creds`` (or once with the site file's or environment's
    credential when none is given); then the stream's existence as the first that may see it."""
    out: list[Finding] = []
    names = BusNames.from_settings(site.nats)
    parties = dict(creds) or {"(site file or environment)": None}
    connected: dict[str, Bus] = {}
    try:
        for party, path in parties.items():
            server, auth = connection(site.nats, url=url, creds=path, ca=ca)
            try:
                bus = await Bus.connect(
                    server, service=f"config-check-{party}", names=names, setup=False, connect_timeout=timeout_s, **auth
                )
            except PowerGuardError as exc:
                out.append(problem(f"nats {party}", str(exc)))
                continue
            connected[party] = bus
            out.append(ok(f"nats {party}", f"connected to {server}"))
        reader = next((connected[p] for p in (*STREAM_READERS, "(site file or environment)") if p in connected), None)
        for stream in names.streams if reader is not None else ():
            try:
                await asyncio.wait_for(reader.js.stream_info(stream), timeout_s)
            except TimeoutError:
                out.append(problem(f"stream {stream}", "no answer: the credential may not read it"))
            except Exception as exc:  # nats.js.errors.NotFoundError and the like
                if "not found" in str(exc).lower():
                    out.append(
                        problem(
                            f"stream {stream}",
                            "does not exist: run `powerguard bootstrap --update --config site.yaml --creds "
                            "creds/admin.creds`",
                        )
                    )
                else:
                    out.append(problem(f"stream {stream}", f"{type(exc).__name__}: {exc}"))
            else:
                out.append(ok(f"stream {stream}", "exists"))
    finally:
        for bus in connected.values():
            await bus.close()
    return out


async def ups(site: SiteConfig, skip: set[str]) -> list[Finding]:
    """Each UPS read once with ups-monitor's driver and timeout."""
    from powerguard.ups_monitor.config import MonitorSettings
    from powerguard.ups_monitor.drivers import make_driver

    settings = site.settings("ups_monitor", MonitorSettings)

    async def one(cfg) -> Finding:
        driver = make_driver(cfg, settings)
        try:
            reading = await asyncio.wait_for(driver.poll(), settings.timeout_s)
        except TimeoutError:
            return problem(f"ups {cfg.name}", f"{cfg.driver} at {cfg.host}: no answer within {settings.timeout_s:g}s")
        except Exception as exc:  # the drivers' own errors name the cause
            return problem(f"ups {cfg.name}", f"{cfg.driver} at {cfg.host}: {exc}")
        finally:
            await driver.close()
        runtime = "?" if reading.runtime_s is None else f"{reading.runtime_s:.0f}"
        return ok(f"ups {cfg.name}", f"read: {'on battery' if reading.on_battery else 'on line'}, runtime {runtime} s")

    return list(await asyncio.gather(*(one(u) for u in site.ups if u.name not in skip)))


async def devices(site: SiteConfig, skip: set[str]) -> list[Finding]:
    """Each node's BMC (power state) and PDU outlets, with power-control's drivers and timeout."""
    from powerguard.power_control.device_health import node_problem
    from powerguard.power_control.drivers import Devices
    from powerguard.power_control.service import load_settings

    settings = load_settings(site)
    devs = Devices(site, settings)
    nodes = [n.name for n in site.nodes if n.name not in skip and (n.bmc is not None or n.outlets)]
    try:
        found = await asyncio.gather(*(node_problem(devs, n, settings.device_timeout_s) for n in nodes))
    finally:
        await devs.close()
    return [
        problem(f"node {n}", f"cannot be acted on: {why}") if why else ok(f"node {n}", "BMC and outlets answer")
        for n, why in zip(nodes, found, strict=True)
    ]
