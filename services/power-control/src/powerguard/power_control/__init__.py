"""PowerGuard power-control: BMC (IPMI, Redfish), PDU and scheduler control for shutdown and restore."""
