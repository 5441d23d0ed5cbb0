"""The restore verifies each file in the one pass that loads it: tensors read straight into their
targets stay bit-exact, a file is checked in full even where only part of it is loaded, a file
that fails after others were loaded is caught and named, the restore then loads an older
checkpoint in full (nothing of the failed one stays), and a fresh start (``allow_fresh_start``)
never starts from a part-loaded model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from powerguard.ckpt_agent import _layout as L
from powerguard.ckpt_agent._hashing import HashingWriter
from powerguard.ckpt_agent._loading import SafeLoadPlanner, VerifyingReader
from powerguard.ckpt_agent._ranks import Ranks
from powerguard.ckpt_agent._restore import Restorer, corrupt_reason
from powerguard.ckpt_agent._retainer import Retainer
from powerguard.ckpt_agent._saver import Saver
from powerguard.ckpt_agent._state import TrainingState
from powerguard.ckpt_agent._tiers import SharedTier
from powerguard.ckpt_agent.errors import CorruptCheckpoint, NoRestorableCheckpoint


def _flip(path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


def _saved(tmp_path, state: dict, threads: int = 2) -> dict:
    writer = HashingWriter(tmp_path, sync_files=False, thread_count=threads)
    dcp.save(state, storage_writer=writer)
    return writer.data_files()


def _state() -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "a": torch.randn(64, 32, generator=g),
        "b": torch.randn(10, generator=g).to(torch.bfloat16),
        "i": torch.arange(100, dtype=torch.int64),
        "s": torch.tensor(3.5, dtype=torch.float64),
        "t": torch.randn(8, 16, generator=g).t(),  # stored from a transposed view
        "obj": {"epoch": 3, "names": ["x", "y"]},  # bytes (pickled by DCP)
    }


def test_tensors_read_straight_into_their_targets_are_bit_exact(tmp_path):
    want = _state()
    files = _saved(tmp_path, want)
    got = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None for k, v in want.items()}
    got["obj"] = {"epoch": None, "names": None}
    reader = VerifyingReader(tmp_path, files=files, key=None)
    dcp.load(got, storage_reader=reader)
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    assert got["obj"] == want["obj"]
    assert reader.direct >= 4  # a, b, i, s: one copy from the page cache, no torch.load


def test_a_file_that_fails_after_others_loaded_is_named(tmp_path):
    want = {f"w{i}": torch.full((256, 256), float(i + 1)) for i in range(4)}
    files = _saved(tmp_path, want, threads=4)
    assert len(files) == 4
    last = sorted(files)[-1]
    _flip(tmp_path / last)
    got = {k: torch.zeros_like(v) for k, v in want.items()}
    with pytest.raises(CheckpointException) as caught:
        dcp.load(got, storage_reader=VerifyingReader(tmp_path, files=files, key=None))
    reason = corrupt_reason(caught.value)
    assert reason is not None and last in reason and "checksum mismatch" in reason
    # the files before it were loaded: why only a full load of another checkpoint may follow
    assert any(torch.equal(got[k], want[k]) for k in want)


def test_a_file_is_checked_in_full_where_only_part_of_it_is_loaded(tmp_path):
    want = {f"w{i}": torch.full((256, 256), float(i + 1)) for i in range(4)}
    files = _saved(tmp_path, want, threads=1)
    (name,) = files
    half = {"w0": torch.zeros(256, 256), "w1": torch.zeros(256, 256)}
    reader = VerifyingReader(tmp_path, files=files, key=None)
    dcp.load(half, storage_reader=reader, planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert torch.equal(half["w0"], want["w0"]) and torch.equal(half["w1"], want["w1"]) and reader.direct == 2
    _flip(tmp_path / name, at=0.9)  # inside w3, which nothing loads
    half = {"w0": torch.zeros(256, 256), "w1": torch.zeros(256, 256)}
    with pytest.raises(CheckpointException) as caught:
        reader = VerifyingReader(tmp_path, files=files, key=None)
        dcp.load(half, storage_reader=reader, planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert name in (corrupt_reason(caught.value) or "")


def test_a_file_no_manifest_lists_is_refused_before_it_is_read(tmp_path):
    files = _saved(tmp_path, _state())
    dropped = sorted(files)[0]
    listed = {k: v for k, v in files.items() if k != dropped}
    got = {k: torch.zeros_like(v) for k, v in _state().items() if isinstance(v, torch.Tensor)}
    got["obj"] = {"epoch": None, "names": None}
    with pytest.raises(CheckpointException) as caught:
        dcp.load(got, storage_reader=VerifyingReader(tmp_path, files=listed, key=None))
    assert "no manifest lists" in (corrupt_reason(caught.value) or "")


class _Job:
    """A model of 6 tensors saved by the agent's saver with 4 writers (4 files per checkpoint)."""

    def __init__(self, tmp_path) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(3)])
        self.ranks = Ranks()
        self.root = str(tmp_path)
        self.fs, _ = L.fs_for(self.root)
        self.state = TrainingState(
            model=self.model, optimizer=None, scheduler=None, extra_state=None, rank_state=None, rank=0
        )
        self.retainer = Retainer(self.fs, self.root, "j", keep=5)
        tier = SharedTier(self.ranks, self.fs, job="j", key=None, retainer=self.retainer, root=self.root)
        self.saver = Saver(
            self.ranks, self.state, tier, job="j", root=self.root, fs=self.fs, key=None,
            every_s=0, overlap=False, node="n1", writers=4,
        )  # fmt: skip

    def save(self, step: int, fill: float) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            for i, p in enumerate(self.model.parameters()):
                p.fill_(fill + i)
        self.saver.save(step)
        self.retainer.join(step)
        return {k: v.clone() for k, v in self.model.state_dict().items()}

    def restorer(self, **kw) -> Restorer:
        return Restorer(
            self.ranks, self.state, job="j", root=self.root, fs=self.fs, remote_url=None, keys=None,
            reshard=False, **kw,
        )  # fmt: skip

    def corrupt_last_file(self, step: int) -> str:
        files = sorted(Path(L.step_dir(self.root, "j", step)).glob("*.distcp"))
        assert len(files) == 4
        _flip(files[-1])
        return files[-1].name

    def equals(self, want: dict[str, torch.Tensor]) -> bool:
        return all(torch.equal(self.model.state_dict()[k], v) for k, v in want.items())


def test_a_checkpoint_failing_half_way_falls_back_to_an_older_one_in_full(tmp_path):
    job = _Job(tmp_path)
    older = job.save(5, fill=1.0)
    job.save(9, fill=50.0)
    bad = job.corrupt_last_file(9)
    with torch.no_grad():
        for p in job.model.parameters():
            p.zero_()
    restorer = job.restorer()
    got = restorer.restore()
    assert got is not None and got.step == 5
    assert job.equals(older)  # nothing of step 9's files that did check out is left
    job2 = job.restorer()
    job2.restore()
    assert job.equals(older)
    # the refusal names the file; without an older one the restore stops (the model is part loaded)
    shutil.rmtree(L.step_dir(job.root, "j", 5))
    with pytest.raises(NoRestorableCheckpoint, match=bad):
        job.restorer().restore()


def test_a_fresh_start_never_starts_from_a_part_loaded_model(tmp_path):
    job = _Job(tmp_path)
    job.save(9, fill=50.0)
    job.corrupt_last_file(9)
    with torch.no_grad():
        for p in job.model.parameters():
            p.fill_(-7.0)
    initial = {k: v.clone() for k, v in job.model.state_dict().items()}
    restorer = job.restorer(allow_fresh_start=True)
    assert restorer.restore() is None
    assert restorer.refused and "checksum mismatch" in restorer.refused[0]
    assert job.equals(initial)  # verified before a byte was loaded


def test_corrupt_reason_ignores_failures_that_are_not_the_files(tmp_path):
    exc = CheckpointException("x", {0: (RuntimeError("size mismatch"), None)})
    assert corrupt_reason(exc) is None
    exc = CheckpointException("x", {1: (CorruptCheckpoint("f: checksum mismatch"), None)})
    assert corrupt_reason(exc) == "f: checksum mismatch"


@pytest.mark.parametrize("threads", [1, 4])
def test_a_node_verifies_what_it_holds_naming_the_bad_files_and_not_the_missing(tmp_path, threads):
    """The node tier's leader checks every file its node holds (``threads`` at once): verified
    files are held, a corrupt one is named, a missing one is only not held (a peer sends it)."""
    from powerguard.ckpt_agent._nodes import verified_here

    job = _Job(tmp_path)
    job.save(1, 1.0)
    directory = L.step_dir(job.root, "j", 1)
    corrupt = job.corrupt_last_file(1)
    gone = sorted(Path(directory).glob("*.distcp"))[0]
    gone.unlink()
    have, manifests, bad = verified_here(directory, L.read_commit(job.fs, directory), None, threads=threads)
    listed = {name for files in manifests.values() for name in files}
    assert len(listed) == 4 and corrupt in listed and gone.name in listed
    assert have >= listed - {corrupt, gone.name} and not have & {corrupt, gone.name}
    assert len(bad) == 1 and corrupt in bad[0] and "checksum mismatch" in bad[0]


class _RunsCode:
    """A pickle that, loaded, creates a file (a stand-in for any code)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_bytes_item_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    """A forger who can write the tier and recompute unkeyed checksums stores a pickle as a
    state's non-tensor value: the restore's planner refuses it by name and runs nothing (DCP's
    default planner, the restore's before, runs it)."""
    marker = tmp_path / "code-ran"
    ckpt = tmp_path / "ckpt"
    files = _saved(ckpt, {"w": torch.ones(4), "lr": _RunsCode(str(marker))})
    got = {"w": torch.zeros(4), "lr": 0.1}
    with pytest.raises(CheckpointException) as err:
        dcp.load(got, storage_reader=VerifyingReader(ckpt, files=files, key=None), planner=SafeLoadPlanner())
    assert "lr: not tensors and plain values, not loaded" in corrupt_reason(err.value)
    assert not marker.exists(), "a restore ran code"
    dcp.load(got, storage_reader=VerifyingReader(ckpt, files=files, key=None))  # DCP's own planner
    assert marker.exists()  # what the restore's planner keeps from running


def test_plain_values_load_through_the_restores_planner(tmp_path):
    want = {"w": torch.arange(6.0), "hp": {"lr": 0.5, "betas": (0.9, 0.99), "fused": None, "name": "adamw"}}
    files = _saved(tmp_path, want)
    got = {"w": torch.zeros(6), "hp": {"lr": 0.0, "betas": (0.0, 0.0), "fused": True, "name": ""}}
    dcp.load(got, storage_reader=VerifyingReader(tmp_path, files=files, key=None), planner=SafeLoadPlanner())
    assert torch.equal(got["w"], want["w"]) and got["hp"] == want["hp"]


def test_check_resumes_comparison_reads_a_forged_value_without_running_it(tmp_path):
    """``powerguard check-resume`` compares two checkpoints by rebuilding their whole state
    from the metadata: its loads parse values as the restore does (it used DCP's own
    rebuild-everything planner, which runs a pickle stored as a value)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    from powerguard.ckpt_agent._compare import entries

    marker = tmp_path / "code-ran"
    ckpt = tmp_path / "ckpt"
    _saved(ckpt, {"w": torch.ones(4), "lr": _RunsCode(str(marker))})
    with pytest.raises(CheckpointException) as err:
        entries(str(ckpt))
    assert "lr: not tensors and plain values, not loaded" in corrupt_reason(err.value)
    assert not marker.exists(), "the comparison ran code"
    _load_state_dict_from_keys(checkpoint_id=str(ckpt))  # DCP's own planner, the comparison's before
    assert marker.exists()


def test_check_resumes_comparison_reads_plain_values(tmp_path):
    from powerguard.ckpt_agent._compare import entries

    _saved(tmp_path, {"w": torch.arange(3.0), "hp": {"lr": 0.5, "name": "adamw"}})
    got = entries(str(tmp_path))
    assert torch.equal(got["w"], torch.arange(3.0)) and got["hp.lr"] == 0.5 and got["hp.name"] == "adamw"
