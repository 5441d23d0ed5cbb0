"""Power drivers behind one async interface, built from the site file.

``Devices`` owns one driver per BMC and per PDU, the per-kind concurrency bounds and the
credential hold-off; ``dry_run`` swaps every device for one that only logs.
"""

from __future__ import annotations

import asyncio

from powerguard.schemas import NodeConfig, PduConfig, SecretNotFound, SecretRef, SiteConfig, secret_value

from ..config import IpmiOptions, PduOptions, PowerControlSettings, RedfishOptions
from ..errors import CredentialUnavailable, PowerControlError
from .base import Guarded, OutletDriver, PowerDriver, PowerState, RestorePolicy
from .dryrun import DryRunOutlets, DryRunPower

__all__ = ["Devices", "Guarded", "OutletDriver", "PowerDriver", "PowerState", "RestorePolicy"]


def _secret(ref: SecretRef | None, what: str, default: str | None = None) -> str:
    if ref is None:
        if default is None:
            raise PowerControlError(f"{what} is not configured")
        return default
    try:
        return secret_value(ref)
    except SecretNotFound as exc:
        raise CredentialUnavailable(f"{what}: {exc}") from None


class Devices:
    def __init__(self, site: SiteConfig, settings: PowerControlSettings, *, dry_run: bool | None = None) -> None:
        self.site = site
        self.settings = settings
        self.dry_run = settings.dry_run if dry_run is None else dry_run
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._bmcs: dict[str, PowerDriver] = {}
        self._bmc_secrets: dict[str, tuple] = {}  # node -> the secrets its driver was made with
        self._pdus: dict[str, OutletDriver] = {}
        self.nodes = {n.name: n for n in site.nodes}
        self.pdu_configs = {p.name: p for p in site.pdus}

    def _guard(self, device: str, kind: str) -> Guarded:
        if kind not in self._slots:
            self._slots[kind] = asyncio.Semaphore(self.settings.max_parallel_per_driver.get(kind, 8))
        return Guarded(
            device,
            timeout_s=self.settings.device_timeout_s,
            slots=self._slots[kind],
            auth_holdoff_s=self.settings.auth_holdoff_s,
        )

    def saturated(self, kind: str) -> bool:
        """Every request slot of this driver kind is taken now (``max_parallel_per_driver``)."""
        slots = self._slots.get(kind)
        return slots is not None and slots.locked()

    def node(self, name: str) -> NodeConfig:
        try:
            return self.nodes[name]
        except KeyError:
            raise PowerControlError(f"node {name!r} is not in the site file") from None

    def bmc(self, node: str) -> PowerDriver | None:
        """The node's BMC driver, or None when the site gives the node no BMC. Its secrets are
        read at every call (a file removed or rotated while the service runs is seen at the next
        action or device check, not at the next start): a driver is made again when they changed;
        one that cannot be read raises :class:`CredentialUnavailable` naming it."""
        cfg = self.node(node).bmc
        if cfg is None:
            return None
        secrets = self._read_bmc_secrets(node, cfg)
        if node not in self._bmcs or self._bmc_secrets.get(node) != secrets:
            self._bmcs[node] = self._make_bmc(node, cfg, secrets)
            self._bmc_secrets[node] = secrets
        return self._bmcs[node]

    def _read_bmc_secrets(self, node: str, cfg) -> tuple:
        if self.dry_run or cfg.driver == "dry-run":
            return ()
        user = _secret(cfg.username, f"node {node}: bmc.username")
        password = _secret(cfg.password, f"node {node}: bmc.password")
        kg = None
        if cfg.driver == "ipmi":
            opts = IpmiOptions.model_validate(cfg.options)
            kg = _secret(opts.kg, f"node {node}: bmc.options.kg") if opts.kg else None
        return (user, password, kg)

    def _make_bmc(self, node: str, cfg, secrets: tuple) -> PowerDriver:
        device = f"bmc:{node}"
        if self.dry_run or cfg.driver == "dry-run":
            return DryRunPower(device, self._guard(device, "dry-run"))
        user, password, kg = secrets
        if cfg.driver == "ipmi":
            opts = IpmiOptions.model_validate(cfg.options)
            common = dict(host=cfg.host, port=cfg.port or 623, user=user, password=password, kg=kg)
            if opts.transport == "ipmitool":
                from .ipmitool import IpmitoolDriver

                return IpmitoolDriver(device, self._guard(device, "ipmi"), cipher_suite=opts.cipher_suite, **common)
            from .ipmi import IpmiDriver

            return IpmiDriver(device, self._guard(device, "ipmi"), **common)
        from .redfish import RedfishDriver

        opts = RedfishOptions.model_validate(cfg.options)
        port = f":{cfg.port}" if cfg.port else ""
        return RedfishDriver(
            device,
            self._guard(device, "redfish"),
            base_url=f"{opts.scheme}://{cfg.host}{port}",
            user=user,
            password=password,
            system_id=opts.system_id,
            verify_tls=opts.verify_tls,
            ca_bundle=opts.ca_bundle,
        )

    def pdu_secrets_problem(self, name: str) -> str | None:
        """Why a PDU's secrets cannot be read now (None: they can, or it has none)."""
        cfg = self.pdu_configs.get(name)
        if cfg is None or self.dry_run or cfg.driver == "dry-run":
            return None
        from powerguard.snmp import auth_data

        try:
            auth_data(PduOptions.model_validate(cfg.options))
        except SecretNotFound as exc:
            return f"pdu {cfg.name}: {exc}"
        return None

    def pdu(self, name: str) -> OutletDriver:
        if name not in self._pdus:
            cfg = self.pdu_configs.get(name)
            if cfg is None:
                raise PowerControlError(f"PDU {name!r} is not in the site file")
            self._pdus[name] = self._make_pdu(cfg)
        return self._pdus[name]

    def _make_pdu(self, cfg: PduConfig) -> OutletDriver:
        device = f"pdu:{cfg.name}"
        if self.dry_run or cfg.driver == "dry-run":
            return DryRunOutlets(device, self._guard(device, "dry-run"))
        from powerguard.snmp import auth_data

        from .pdu import ApcPduDriver

        opts = PduOptions.model_validate(cfg.options)
        try:
            auth = auth_data(opts)  # no default community: switching outlets needs the write one
        except SecretNotFound as exc:
            raise CredentialUnavailable(f"pdu {cfg.name}: {exc}") from None
        except ValueError as exc:
            raise PowerControlError(
                f"pdu {cfg.name}: {exc} (the PDU's write community; no 'private' default)"
            ) from None
        return ApcPduDriver(device, self._guard(device, "pdu"), host=cfg.host, port=cfg.port, auth=auth)

    async def close(self) -> None:
        for d in [*self._bmcs.values(), *self._pdus.values()]:
            await d.close()
