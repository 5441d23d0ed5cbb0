"""The agent's collaborators on their own (one process: the collectives are the identity): each
owns its state and returns values; none needs the agent."""

from __future__ import annotations

import itertools

import pytest
import torch

from powerguard.ckpt_agent import _layout as L
from powerguard.ckpt_agent._agreement import Decision, StepAgreement, Wants
from powerguard.ckpt_agent._config import AgentConfig
from powerguard.ckpt_agent._hold import Hold
from powerguard.ckpt_agent._ranks import Ranks
from powerguard.ckpt_agent._restore import Restorer
from powerguard.ckpt_agent._retainer import Retainer
from powerguard.ckpt_agent._saver import Saver
from powerguard.ckpt_agent._state import TrainingState
from powerguard.ckpt_agent._tiers import SharedTier

NOTHING = Wants(pending=None, periodic=False, busy=False, unfinished=False)


def test_the_agreement_paces_itself_on_the_measured_step_time():
    agreement = StepAgreement(Ranks(), pipelined=True, sync_every_n_steps=1, agree_every_s=0.5, agree_timeout_s=5)
    agreed_at = []
    for i in range(40):
        now = i * 0.125  # 0.125 s steps: an agreement about every 0.5 s, every 4 boundaries
        if agreement.boundary(now):
            assert agreement.agree(NOTHING) == Decision(request=False, periodic=False, busy=False, unfinished=False)
            agreed_at.append(agreement.boundaries)
            agreement.scheduled()
    assert agreed_at[:3] == [1, 2, 6]  # at every boundary until a step time is known
    assert all(b - a == 4 for a, b in itertools.pairwise(agreed_at[1:]))
    assert agreement.agreements == len(agreed_at)


def test_a_decision_is_what_the_rank_wants_when_it_is_alone():
    agreement = StepAgreement(Ranks(), pipelined=True, sync_every_n_steps=3, agree_every_s=0, agree_timeout_s=5)
    assert agreement.boundary(0.0)
    wants = Wants(pending=None, periodic=True, busy=False, unfinished=True)
    assert agreement.agree(wants) == Decision(request=False, periodic=True, busy=False, unfinished=True)
    agreement.scheduled()
    assert [agreement.boundary(float(t)) for t in range(1, 4)] == [False, False, True]  # sync_every_n_steps


def test_a_hold_without_a_bus_lets_the_rank_go_at_once():
    hold = Hold(None, Ranks(), poll_s=0.01)
    pause = hold.begin(7, [])
    poll = hold.poll(pause)
    assert (poll.go, poll.another, poll.pending) == (True, False, None)
    hold.wait(pause)  # one poll interval
    assert 0.01 <= hold.end(pause) < 5.0  # the pause's own length, as the agent adds it to paused_s


def test_the_pause_takes_sigterm_before_it_says_it_is_paused():
    """Whoever reads "paused at step" (an operator, a scheduler's script, the stop test) may send
    SIGTERM at once: before, the line came first, and a SIGTERM between the two went to
    Lightning's flag-only handler alone, leaving the rank paused until torchrun killed it 30 s
    later (seen in CI)."""
    import logging
    import signal

    seen: list[object] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "paused at step" in record.getMessage():
                seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    catch = Catch()
    logger = logging.getLogger("powerguard.ckpt_agent")
    logger.addHandler(catch)
    level = logger.level
    logger.setLevel(logging.INFO)
    hold = Hold(None, Ranks(), poll_s=0.01)
    try:
        pause = hold.begin(3, [])
        hold.end(pause)
    finally:
        logger.removeHandler(catch)
        logger.setLevel(level)
        signal.signal(signal.SIGTERM, before)
    assert len(seen) == 1 and seen[0] is not before, "the pause said it was paused before it took SIGTERM"


def test_a_pause_joined_by_a_second_saga_ends_only_when_both_released_it():
    """A drill paused the ranks, then a real outage's request asked for a pause too: the drill,
    giving way, releases its own pause; the ranks stay until the real saga releases theirs."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from powerguard.ckpt_agent._requests import RequestQueue
    from powerguard.schemas import CheckpointRequestData

    queue = RequestQueue()  # what the bus thread feeds; Hold asks through the thread's two calls
    hold = Hold(SimpleNamespace(released=queue.all_released, pending=queue.pending), Ranks(), poll_s=0.01)

    def request(saga: str) -> CheckpointRequestData:
        deadline = datetime.now(UTC)
        return CheckpointRequestData(
            request_id=f"{saga}/j/ckpt", saga_id=saga, job="j", deadline=deadline, then="pause"
        )

    pause = hold.join(hold.begin(7, [request("drill")]), [request("real")])
    queue.release("drill")
    assert not hold.poll(pause).go, "the drill's release let go of the real saga's pause"
    queue.release("real")
    assert hold.poll(pause).go


def test_the_saver_and_the_restorer_meet_only_on_disk(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ranks = Ranks()
    fs, _ = L.fs_for(str(tmp_path))
    state = TrainingState(model=model, optimizer=None, scheduler=None, extra_state=None, rank_state=None, rank=0)
    retainer = Retainer(fs, str(tmp_path), "j", keep=2)
    tier = SharedTier(ranks, fs, job="j", key=None, retainer=retainer, root=str(tmp_path))
    saver = Saver(ranks, state, tier, job="j", root=str(tmp_path), fs=fs, key=None, every_s=0, overlap=False, node="n1")
    saved = saver.save(5, saga_id="s1")
    assert saved.path == L.step_dir(str(tmp_path), "j", 5) and saved.durability == "local"
    retainer.join(5)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.zero_()
    restorer = Restorer(ranks, state, job="j", root=str(tmp_path), fs=fs, remote_url=None, keys=None, reshard=False)
    got = restorer.restore()
    assert (got.step, got.tier, got.saga_id) == (5, "local", "s1")  # the saga its COMMIT names
    assert all(torch.equal(model.state_dict()[k], v) for k, v in want.items())  # bit-exact
    empty = Restorer(ranks, state, job="other", root=str(tmp_path), fs=fs, remote_url=None, keys=None, reshard=False)
    assert empty.restore() is None


def test_a_jobs_own_newer_checkpoint_stands_and_an_older_one_is_overwritten(tmp_path):
    """Two checkpoint systems that agree: the job loaded its own checkpoint (nanoGPT's ckpt.pt)
    of some step; PowerGuard's is loaded only when newer (it was loaded whatever its age, and
    training went on from step 85 after the job had loaded its own of step 400)."""
    model = torch.nn.Linear(4, 2)
    ranks = Ranks()
    fs, _ = L.fs_for(str(tmp_path))
    state = TrainingState(model=model, optimizer=None, scheduler=None, extra_state=None, rank_state=None, rank=0)
    retainer = Retainer(fs, str(tmp_path), "j", keep=5)
    tier = SharedTier(ranks, fs, job="j", key=None, retainer=retainer, root=str(tmp_path))
    saver = Saver(ranks, state, tier, job="j", root=str(tmp_path), fs=fs, key=None, every_s=0, overlap=False, node="n1")
    for step in (5, 9):
        saver.save(step)
    retainer.join(5)
    restorer = Restorer(ranks, state, job="j", root=str(tmp_path), fs=fs, remote_url=None, keys=None, reshard=False)
    assert restorer.restore(own_step=7).step == 9  # PowerGuard's is newer: it wins
    assert restorer.restore(own_step=12) is None  # the job's own is newer: it stands
    assert restorer.said(None).endswith(
        "resumed at step 13 from its own checkpoint of step 12: no PowerGuard checkpoint is newer"
    )


@pytest.mark.parametrize(
    ("bad", "names"),
    [
        ({"local_scope": "disk"}, "local_scope"),
        ({"keep": 0}, "keep"),
        ({"hold_policy": "sleep"}, "hold_policy"),
        ({"framework": "keras"}, "framework"),
        ({"framework": "hf", "remote_url": "file:///x"}, "shared local tier only"),
        ({"writer_threads": 0}, "writer_threads"),
        ({"allow_rollback": -1}, "allow_rollback"),
        ({"remote_url": "s3://b/p", "remote_options": {"checksum": "MD5"}}, r"remote_options\.checksum"),
        ({"remote_url": "file:///x", "remote_options": {"region": "eu-1"}}, "the S3 tier's"),
        ({"remote_url": "s3://b/p", "remote_options": {"part_size_mb": 1}}, r"remote_options\.part_size_mb"),
    ],
)
def test_settings_are_checked_once_and_name_what_is_wrong(tmp_path, bad, names):
    ok = dict(
        job="j",
        local_dir=tmp_path,
        checksum_key_file=None,
        pipelined_agreement=True,
        remote_url=None,
        remote_options=None,
        local_every_s=0,
        remote_every_s=0,
        keep=1,
        keep_remote=1,
        sync_every_n_steps=1,
        agree_every_s=0,
        agree_timeout_s=1,
        overlap_staging=False,
        hold_policy=None,
        pause_poll_s=0.1,
        local_scope="shared",
        replicas=1,
        reshard=False,
        framework=None,
        allow_fresh_start=False,
        writer_threads=None,
        allow_rollback=None,
    )
    assert set(ok) == AgentConfig.ARGUMENTS  # every setting the agent takes, and no other
    assert AgentConfig.checked(**ok).local_root == str(tmp_path)
    with pytest.raises(ValueError, match=names):
        AgentConfig.checked(**{**ok, **bad})


def test_the_http_trigger_without_a_bus_refuses_to_start_naming_why(tmp_path):
    from powerguard.ckpt_agent import CheckpointAgent

    with pytest.raises(ValueError, match="http_port needs nats_url"):
        CheckpointAgent(job="j", model=torch.nn.Linear(2, 2), local_dir=tmp_path, http_port=8080)


def test_parallel_writers_by_size_and_small_states_stay_one_file():
    from powerguard.ckpt_agent._writers import local_bytes, writer_threads

    mib = 1 << 20
    assert writer_threads(256 * mib) == writer_threads(4096 * mib) == 16  # one per 16 MiB, at most 16
    assert writer_threads(64 << 30) == 16
    assert writer_threads(64 * mib) == 4 and writer_threads(100 * mib) == 6  # 4 at least, one per 16 MiB
    assert writer_threads(40 * mib) == 2  # no file under 16 MiB
    assert writer_threads(10 * mib) == 1
    assert writer_threads(0) == 1
    state = {"model": {"w": torch.zeros(4, 4)}, "optim": [torch.zeros(2, dtype=torch.float64)], "step": 3}
    assert local_bytes(state) == 16 * 4 + 2 * 8


def test_restore_readers_are_shared_by_the_ranks_of_a_node(monkeypatch):
    from powerguard.ckpt_agent._wiring import _local_ranks
    from powerguard.ckpt_agent._writers import reader_threads

    assert [reader_threads(n) for n in (1, 2, 4, 8)] == [4, 2, 1, 1]
    for env, want in (("4", 4), ("", 1), ("x", 1), ("0", 1)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", env)
        assert _local_ranks() == want
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert _local_ranks() == 1


def test_parallel_verification_names_the_first_bad_file(tmp_path):
    from powerguard.ckpt_agent.errors import CorruptCheckpoint

    fs, _ = L.fs_for(str(tmp_path))
    files = {}
    for i in range(6):
        (tmp_path / f"f{i}").write_bytes(bytes([i]) * 1000)
        size, digest, _ = L.hash_file(fs, str(tmp_path / f"f{i}"))
        files[f"f{i}"] = {"size": size, "xxh3": digest}
    L.verify_files(fs, str(tmp_path), files, sorted(files), threads=4)  # all good
    (tmp_path / "f4").write_bytes(b"x" * 1000)
    (tmp_path / "f2").unlink()
    for threads in (1, 4):
        with pytest.raises(CorruptCheckpoint, match="f2: missing"):
            L.verify_files(fs, str(tmp_path), files, sorted(files), threads=threads)
