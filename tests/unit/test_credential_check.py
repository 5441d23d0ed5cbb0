"""A command run with the wrong party's credential is refused in words, before the server would
answer its first forbidden request with a timeout (the CLI's commands and bootstrap share it)."""

from __future__ import annotations

import pytest

from powerguard.bus import BusNames
from powerguard.bus import creds as creds_mod
from powerguard.bus.connect_checks import require_credential
from powerguard.schemas import ConfigError


@pytest.fixture(scope="module")
def auth(tmp_path_factory):
    d = tmp_path_factory.mktemp("auth")
    creds_mod.init(d, names=BusNames(), sites=["dc1"])
    creds_mod.issue(d, "agent", job="jobA")
    return d


def test_the_right_party_passes_and_no_credential_is_not_checked(auth):
    assert require_credential(auth / "admin.creds", "admin", command="powerguard bootstrap") == "admin"
    assert require_credential(auth / "operator.creds", "operator", "admin", command="powerguard drill") == "operator"
    assert require_credential(None, "admin", command="powerguard bootstrap") is None


def test_another_party_is_named_with_the_credential_needed(auth):
    with pytest.raises(ConfigError) as err:
        require_credential(auth / "observer.creds", "operator", "admin", command="powerguard drill")
    msg = str(err.value)
    assert "`powerguard drill` needs the operator or admin credential" in msg
    assert f"{auth / 'observer.creds'} is the observer credential" in msg and "creds/operator.creds" in msg


def test_a_training_jobs_credential_is_named_as_such(auth):
    with pytest.raises(ConfigError, match=r"is a training job's \(agent\.jobA\)"):
        require_credential(auth / "agent-jobA.creds", "admin", command="powerguard bootstrap")
