"""The simulated site used by ``powerguard demo``: UPS and PDU as SNMP agents, one IPMI BMC
per node, and training ranks with the ckpt-agent, all speaking the real protocols on loopback."""
