"""The SNMP plumbing both ups-monitor and power-control use: one credential model, one
error classification."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from pysnmp.hlapi.v3arch.asyncio import CommunityData, UsmUserData

from powerguard.power_control.config import PduOptions
from powerguard.snmp import SnmpCredentials, auth_data, classify
from powerguard.ups_monitor.config import SnmpOptions


@pytest.mark.parametrize("model", [SnmpCredentials, SnmpOptions, PduOptions])
def test_v3_is_auth_priv_in_both_services(model):
    with pytest.raises(ValidationError, match="authPriv only: set priv_key"):
        model.model_validate({"version": "3", "user": "u", "auth_key": {"env": "A"}})
    with pytest.raises(ValidationError):
        model.model_validate({"version": "1"})


def test_auth_data_reads_secrets_at_use(monkeypatch):
    monkeypatch.setenv("PG_T_A", "authkey-123")
    monkeypatch.setenv("PG_T_P", "privkey-123")
    creds = SnmpCredentials(version="3", user="u", auth_key={"env": "PG_T_A"}, priv_key={"env": "PG_T_P"})
    usm = auth_data(creds)
    assert isinstance(usm, UsmUserData) and usm.userName == "u"
    assert (usm.authentication_key, usm.privacy_key) == ("authkey-123", "privkey-123")  # read now, from the env
    assert usm.security_level == "authPriv"
    monkeypatch.setenv("PG_T_A", "rotated-456")  # rotated: the next use reads the new one
    assert auth_data(creds).authentication_key == "rotated-456"
    community = auth_data(SnmpCredentials(), default_community="public")
    assert isinstance(community, CommunityData) and community.communityName == "public"
    mine = auth_data(SnmpCredentials(community={"env": "PG_T_P"}), default_community="public")
    assert mine.communityName == "privkey-123"  # a configured community wins over the default
    with pytest.raises(ValueError, match=r"needs options\.community"):
        auth_data(SnmpCredentials())  # a PDU: no default write community


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("No SNMP response received before timeout", "timeout"),
        ("Wrong SNMP PDU digest", "auth"),
        ("Unknown USM user", "auth"),
        ("unknownUserName", "auth"),
        ("Ciphering services not available or ciphertext is broken", "other"),
    ],
)
def test_one_error_classification(text, kind):
    assert classify(text) == kind
