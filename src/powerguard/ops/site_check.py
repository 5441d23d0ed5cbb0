"""``powerguard config check``, the file alone (``--offline``): the site file against every
service's schema, every secret reference resolved, the credential files each service will use
(present, private, parseable, the right party's, made for this site), the TLS files. No I/O but
reading files."""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

from pydantic import BaseModel

from powerguard.bus.connect_checks import credential_name
from powerguard.schemas import PowerGuardError, SecretRef, SiteConfig, load_site
from powerguard.schemas.file_modes import exposure

from .findings import Finding, failed, ok, problem

SERVICES = ("ups-monitor", "coordinator", "power-control")
# the parties whose credential the check looks for in --creds-dir (absent ones: only a note)
PARTIES = (*SERVICES, "observer", "operator", "admin")


def load(path: Path) -> tuple[SiteConfig | None, list[Finding]]:
    """The site file, or the problems that keep it from loading (one per line of the error)."""
    try:
        site = load_site(path)
    except PowerGuardError as exc:
        head, *rest = str(exc).splitlines()
        lines = [x.strip() for x in rest] or [head]
        return None, [problem("site file", f"{path}: {line}") for line in lines]
    return site, [ok("site file", f"{path}: site {site.site}, {len(site.ups)} UPS, {len(site.nodes)} nodes")]


SECTIONS = ("coordinator", "ups_monitor", "power_control", "ckpt_agent")


def section_models() -> dict[str, type[BaseModel]]:
    """Each installed service's model of its section, as the service declares it (entry points
    ``powerguard.site_sections``): the tools validate a section without importing the service."""
    return {ep.name: ep.load() for ep in entry_points(group="powerguard.site_sections")}


def sections(site: SiteConfig) -> list[Finding]:
    """Each service's own section, validated by that service's model."""
    models = section_models()
    out = []
    for name in SECTIONS:
        model = models.get(name)
        if model is None:
            state = "present" if site.section(name) else "absent"
            out.append(ok(f"section {name}", f"{state}: not checked here (the service is not installed on this host)"))
            continue
        try:
            site.settings(name, model)
        except PowerGuardError as exc:
            out.append(problem(f"section {name}", str(exc).removeprefix(f"site {site.site}: ")))
        else:
            out.append(ok(f"section {name}", "valid" if site.section(name) else "absent: the defaults"))
    return out


def _refs(value: object, path: str) -> Iterator[tuple[str, SecretRef]]:
    if isinstance(value, SecretRef):
        yield path, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _refs(getattr(value, name), f"{path}.{name}" if path else name)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            label = getattr(item, "name", None)
            yield from _refs(item, f"{path}[{label if isinstance(label, str) else i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, dict) and set(v) <= {"env", "file"} and len(v) == 1:
                try:
                    yield f"{path}.{k}", SecretRef.model_validate(v)
                except ValueError:
                    continue
            else:
                yield from _refs(v, f"{path}.{k}")


def secrets(site: SiteConfig) -> list[Finding]:
    """Every ``{env: ...}`` / ``{file: ...}`` reference resolves (as the user running the check:
    run it as the services' user, or with their environment)."""
    out = []
    for path, ref in _refs(site, ""):
        try:
            ref.resolve()
        except PowerGuardError as exc:
            out.append(problem(f"secret {path}", f"{ref}: {exc}", _owner(path)))
        else:
            if ref.file is not None and (why := exposure(ref.file)):
                out.append(problem(f"secret {path}", why, _owner(path)))
            else:
                out.append(ok(f"secret {path}", f"{ref} resolves", _owner(path)))
    return out


_OWNERS = {"ups": "ups", "nodes": "node", "pdus": "pdu"}


def _owner(path: str) -> tuple[str, str] | None:
    """The UPS, node or PDU a secret's place in the site file belongs to (``nodes[n1].bmc...``)."""
    if m := re.match(r"(ups|nodes|pdus)\[([^\]]+)\]", path):
        return _OWNERS[m[1]], m[2]
    return None


async def drivers(site: SiteConfig, found: list[Finding] = ()) -> list[Finding]:
    """Each UPS's, PDU's and BMC's driver settings, as its service builds them (no I/O); a device
    whose secret was already reported (``found``) is not reported again."""
    from powerguard.power_control.drivers import Devices
    from powerguard.power_control.errors import PowerControlError
    from powerguard.power_control.service import load_settings
    from powerguard.ups_monitor.config import MonitorSettings
    from powerguard.ups_monitor.drivers import make_driver

    out = []
    try:
        monitor = site.settings("ups_monitor", MonitorSettings)
        control = load_settings(site)
    except PowerGuardError:
        return out  # reported by sections()
    bad = {kind: failed(found, kind) for kind in ("ups", "node", "pdu")}
    for ups in site.ups:
        if ups.name in bad["ups"]:
            continue
        try:
            await make_driver(ups, monitor).close()
        except (PowerGuardError, ValueError) as exc:
            out.append(problem(f"ups {ups.name}", str(exc).removeprefix(f"ups {ups.name}: "), ("ups", ups.name)))
    from powerguard.power_control.schedulers import make_scheduler

    try:
        jobs = make_scheduler(control.scheduler)
    except PowerGuardError as exc:
        out.append(problem("job adapter", str(exc)))
    else:
        try:
            if why := await jobs.check({n.name: list(n.feeds) for n in site.nodes}):
                out.append(problem("job adapter", why))
        finally:
            await jobs.close()
    devices = Devices(site, control)
    # (what, the site's thing it belongs to, name, how power-control builds its driver)
    built = [("pdu", "pdu", p.name, devices.pdu) for p in site.pdus]
    built += [("bmc", "node", n.name, devices.bmc) for n in site.nodes]
    try:
        for what, kind, name, make in built:
            if name in bad[kind]:
                continue
            try:
                make(name)
            except (PowerControlError, PowerGuardError, ValueError) as exc:
                out.append(problem(f"{what} {name}", str(exc).removeprefix(f"node {name}: "), (kind, name)))
    finally:
        await devices.close()
    return out


def _private(path: Path) -> str | None:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"mode {stat.filemode(mode)}: readable by others than its owner (chmod 600 {path})"
    return None


def credentials(site: SiteConfig, creds_dir: Path | None, given: dict[str, Path]) -> list[Finding]:
    """Each party's credential: ``given[party]`` or ``<creds_dir>/<party>.creds``."""
    out = []
    meta_sites: list[str] | None = None
    if creds_dir is not None:
        try:
            meta_sites = json.loads((creds_dir / "deployment.json").read_text())["sites"]
        except (OSError, ValueError, KeyError):
            meta_sites = None
        if meta_sites is not None and site.site not in meta_sites:
            out.append(
                problem(
                    f"credentials {creds_dir}",
                    f"made for site(s) {', '.join(meta_sites)}, not {site.site}: the server lets them say nothing "
                    f"about {site.site} (`powerguard creds init --config site.yaml`)",
                )
            )
    for party in PARTIES:
        path = given.get(party) or (creds_dir / f"{party}.creds" if creds_dir is not None else None)
        if path is None:
            continue
        where, about = f"credential {party}", ("credential", party)
        if not path.exists():
            if party in SERVICES or party in given:
                out.append(
                    problem(
                        where, f"{path} does not exist (`powerguard creds init` or `creds issue --role {party}`)", about
                    )
                )
            continue
        try:
            name = credential_name(path)
        except PowerGuardError as exc:
            out.append(problem(where, str(exc), about))
            continue
        if name != party:
            out.append(problem(where, f"{path} is the {name or 'unnamed'} credential, not {party}'s", about))
            continue
        if (why := _private(path)) is not None:
            out.append(problem(where, f"{path}: {why}", about))
            continue
        out.append(ok(where, f"{path}: {party}'s", about))
    if creds_dir is not None and creds_dir.is_dir():
        out += _creds_dir_secrets(creds_dir)
    nats = site.nats
    for field in ("creds_file", "nkey_seed_file", "tls_ca", "tls_cert", "tls_key"):
        value = getattr(nats, field)
        if value is not None and not Path(value).is_file():
            out.append(problem(f"nats.{field}", f"{value} does not exist"))
        elif value is not None and field in ("creds_file", "nkey_seed_file", "tls_key") and (why := exposure(value)):
            out.append(problem(f"nats.{field}", why))
    if nats.tls_ca is not None and (ca_key := Path(nats.tls_ca).with_name("ca-key.pem")).exists():
        out.append(
            problem(
                "nats.tls_ca",
                f"{ca_key} is on this host: it signs certificates every PowerGuard client trusts; move it offline "
                "(docs/deploy-bare-metal.md, TLS and credentials)",
            )
        )
    return out


def _creds_dir_secrets(creds_dir: Path) -> list[Finding]:
    """The credentials directory 0700 and every seed and other credential in it 0600 (the
    parties' own are checked with them)."""
    out = []
    mode = stat.S_IMODE(creds_dir.stat().st_mode)
    if mode & 0o077:
        out.append(problem(f"credentials {creds_dir}", f"mode {mode:04o}: chmod 700 {creds_dir}"))
    for path in sorted([*creds_dir.glob("*.nk"), *creds_dir.glob("*.creds")]):
        if path.name in {f"{p}.creds" for p in PARTIES}:
            continue
        if (why := _private(path)) is not None:
            out.append(problem(f"credentials {creds_dir}", f"{path}: {why}"))
    return out


async def offline(
    path: Path, *, creds_dir: Path | None = None, given: dict[str, Path] | None = None
) -> tuple[SiteConfig | None, list[Finding]]:
    site, found = load(path)
    if site is None:
        return None, found
    found += sections(site) + secrets(site)
    found += await drivers(site, found)
    found += credentials(site, creds_dir, given or {})
    return site, found
