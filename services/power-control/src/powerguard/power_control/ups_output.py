"""A UPS's output, as the saga's last step of a long outage asks it (``UpsOutputOffRequested``):
which driver tells which UPS, built from the site file when first needed (its credential read
then, never logged)."""

from __future__ import annotations

from powerguard.schemas import SiteConfig, UpsConfig, secret_value

from .drivers.base import Guarded
from .drivers.ups_nut import DEFAULT_PORT, NutUpsOutput
from .errors import CommandRejected, CredentialUnavailable


class UpsOutputs:
    def __init__(self, site: SiteConfig, *, timeout_s: float) -> None:
        self._ups: dict[str, UpsConfig] = {u.name: u for u in site.ups}
        self._timeout_s = timeout_s
        self._drivers: dict[str, NutUpsOutput] = {}

    def __contains__(self, ups: str) -> bool:
        return ups in self._ups

    def driver(self, ups: str) -> NutUpsOutput:
        """The UPS's output driver; :class:`CommandRejected` naming what the site file lacks."""
        if ups in self._drivers:
            return self._drivers[ups]
        cfg = self._ups[ups]
        if cfg.control is None:
            raise CommandRejected(f"ups:{ups}: no 'control' credential in the site file: the UPS cannot be told")
        if cfg.driver != "nut":
            raise CommandRejected(
                f"ups:{ups}: telling a UPS to cut its output and return is built for NUT (upsd) only, "
                f"not yet for driver {cfg.driver}"
            )
        try:
            user, password = secret_value(cfg.control.username), secret_value(cfg.control.password)
        except Exception as exc:
            raise CredentialUnavailable(f"ups:{ups}: control credential unavailable: {exc}") from None
        device = f"ups:{ups}"
        self._drivers[ups] = NutUpsOutput(
            device,
            Guarded(device, timeout_s=self._timeout_s),
            host=cfg.host,
            port=cfg.port or DEFAULT_PORT,
            ups=str(cfg.options.get("ups_name") or cfg.name),
            user=user or "",
            password=password or "",
        )
        return self._drivers[ups]
