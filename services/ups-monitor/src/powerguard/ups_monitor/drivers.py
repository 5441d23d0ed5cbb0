"""The driver of each UPS of the site file: NUT, SNMP (UPS-MIB, APC) or apcupsd, with its
secrets read and its options checked (a ConfigError names the UPS)."""

from __future__ import annotations

from powerguard.schemas import ConfigError, UpsConfig, secret_value

from .config import MonitorSettings, NutOptions, SnmpOptions
from .nut import NutDriver


def make_driver(cfg: UpsConfig, settings: MonitorSettings):
    if cfg.driver == "nut":
        opts = NutOptions.model_validate(cfg.options)
        password = secret_value(opts.password)
        return NutDriver(
            host=cfg.host,
            port=cfg.port,
            ups_name=opts.ups_name or cfg.name,
            user=opts.user,
            password=password,
            timeout=settings.timeout_s,
        )
    if cfg.driver == "snmp":
        from powerguard.snmp import auth_data

        from .snmp import SnmpDriver

        o = SnmpOptions.model_validate(cfg.options)
        try:
            auth = auth_data(o, default_community="public")  # read-only monitoring: the usual default
        except ValueError as exc:
            raise ConfigError(f"ups {cfg.name}: {exc}") from None
        return SnmpDriver(
            name=cfg.name,
            host=cfg.host,
            port=cfg.port,
            auth=auth,
            profile=o.profile,
            timeout=settings.timeout_s,
            retries=o.retries,
        )
    if cfg.driver == "apcupsd":
        from .apcupsd import ApcupsdDriver

        return ApcupsdDriver(name=cfg.name, host=cfg.host, port=cfg.port, timeout=settings.timeout_s * 0.8)
    raise ConfigError(f"ups {cfg.name}: unknown driver {cfg.driver!r}")
