"""Threat: whoever can write a checkpoint tier (the NAS, the bucket, a node's disk) forges DCP's
``.metadata`` as a pickle that runs code, and recomputes its checksum in COMMIT. Without a site
key nothing can tell the forgery from the real thing by checksum; the restore must still run no
code, refuse the forged checkpoint with the reason, and fall back to the previous one bit-exact.
With the real agent in a real (single-rank) process group."""

from __future__ import annotations

import json
import logging
import pickle

import torch
from torch import nn

from powerguard.ckpt_agent import CheckpointAgent
from powerguard.ckpt_agent import _layout as L


class _RunsCode:
    """A pickle that, loaded, creates a file (a stand-in for any code)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _agent(tmp_path, seed: int = 0) -> tuple[CheckpointAgent, nn.Module]:
    torch.manual_seed(seed)
    model = nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return CheckpointAgent(job="f", model=model, optimizer=opt, local_dir=tmp_path / "ckpt", local_every_s=0), model


def test_13_a_forged_metadata_runs_no_code_and_the_restore_falls_back_bit_exact(tmp_path, caplog):
    writer, model = _agent(tmp_path)
    writer.save(3)
    at_3 = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    writer.save(5)
    writer.close()
    newest = sorted((tmp_path / "ckpt").rglob("step-*"))[-1]
    assert newest.name.endswith("5")
    marker = tmp_path / "code-ran"
    forged = pickle.dumps(_RunsCode(str(marker)))
    (newest / ".metadata").write_bytes(forged)
    commit = json.loads((newest / L.COMMIT).read_text())
    commit["metadata_xxh3"] = L.digest_bytes(forged)  # the forger recomputes the unkeyed checksum
    (newest / L.COMMIT).write_text(json.dumps(commit))

    caplog.set_level(logging.WARNING)
    reader, restored = _agent(tmp_path, seed=1)  # other initial weights: the restore must set them
    assert reader.restore() == 4, "the forged step 5 must be refused and step 3 restored"
    reader.close()
    assert not marker.exists(), "restoring a checkpoint ran code"
    assert all(torch.equal(restored.state_dict()[k], v) for k, v in at_3.items())
    assert "io.open, which DCP's metadata never holds" in caplog.text  # skipped, with the reason


def test_13_a_real_metadata_still_loads(tmp_path):
    writer, model = _agent(tmp_path)
    writer.save(7)
    writer.close()
    reader, restored = _agent(tmp_path, seed=2)
    assert reader.restore() == 8
    reader.close()
    assert all(torch.equal(restored.state_dict()[k], v) for k, v in model.state_dict().items())


def test_13_an_enum_pickled_by_getattr_loads_and_any_other_getattr_is_refused():
    """Debian's Python 3.11.2 pickles DCP's metadata enums as ``getattr(Enum, "NAME")``: that form
    loads, and ``getattr`` on anything but an admitted enum is refused."""
    import io

    import pytest
    from torch.distributed.checkpoint import metadata as m

    from powerguard.ckpt_agent._metadata import ForgedMetadata, _Unpickler

    member = next(iter(m._MEM_FORMAT_ENCODING))

    class ByName:
        def __reduce__(self):
            return (getattr, (m._MEM_FORMAT_ENCODING, member.name))

    class Other:
        def __reduce__(self):
            return (getattr, (torch.Size, "__class__"))

    assert _Unpickler(io.BytesIO(pickle.dumps(ByName()))).load() is member
    with pytest.raises(ForgedMetadata, match="not a member of DCP's metadata enums"):
        _Unpickler(io.BytesIO(pickle.dumps(Other()))).load()
