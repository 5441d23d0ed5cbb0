"""PowerGuard ups-monitor: UPS monitoring over SNMP (UPS-MIB, APC PowerNet, traps), NUT and apcupsd."""
