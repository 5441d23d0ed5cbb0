"""A UPS's output, as the saga's last step of a long outage asks it (``UpsOutputOffRequested``):
which driver tells which UPS, built from the site file when first needed (its credential read
then, never logged): NUT through upsd, SNMP (UPS-MIB or APC PowerNet), or the site's own
command (``control.options.command``: apcupsd's killpower on the host wired to the UPS)."""

from __future__ import annotations

from powerguard.schemas import SiteConfig, UpsConfig, secret_value

from .drivers.base import Guarded
from .drivers.ups_command import CommandUpsOutput
from .drivers.ups_nut import DEFAULT_PORT, NutUpsOutput
from .drivers.ups_snmp import UpsMibOutput
from .errors import CommandRejected, CredentialUnavailable


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
