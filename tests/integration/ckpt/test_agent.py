"""The ckpt-agent in real 2-rank torch.distributed jobs (torchrun, gloo) against a real nats-server."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
import torch

from powerguard.ckpt_agent import verify_checkpoint
from powerguard.schemas import (
    AgentRegistered,
    CheckpointDurable,
    CheckpointFailed,
    CheckpointRequestData,
    CheckpointRequested,
    JobResumed,
    utcnow,
)
from tests.waiting import eventually

from .runner import Trainer, run

pytestmark = pytest.mark.integration
STEPS = 80


async def registered(bus, job: str, timeout: float = 60, ranks: frozenset[int] = frozenset({0, 1})) -> None:
    """Every one of ``ranks`` of ``job`` registered: each listens for its requests by then."""
    seen: set[int] = set()
    async with bus.subscribe(AgentRegistered, deliver="all") as sub:

        async def wait() -> None:
            async for ev in sub:
                if ev.data.job == job:
                    seen.add(ev.data.rank)
                    if seen >= ranks:
                        return

        await asyncio.wait_for(wait(), timeout)


async def request(bus, job: str, deadline_s: float = 60, rid: str = "req-1", acks: str = "rank") -> CheckpointRequested:
    event = CheckpointRequested(
        data=CheckpointRequestData(
            request_id=rid, saga_id="saga-t", job=job, deadline=utcnow() + timedelta(seconds=deadline_s), acks=acks
        )
    )
    await bus.publish(event)
    return event


async def answers(sub, n: int, timeout: float = 60) -> list:
    out = []

    async def collect() -> None:
        async for ev in sub:
            out.append(ev)
            if len(out) == n:
                return

    await asyncio.wait_for(collect(), timeout)
    return out


def equal_params(a_path, b_path) -> bool:
    a, b = torch.load(a_path), torch.load(b_path)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


async def test_request_checkpoints_both_ranks_at_one_step_and_acks(bus, nats_server, tmp_path):
    acks = bus.subscribe(CheckpointDurable, CheckpointFailed, deliver="all")
    await acks.start()
    t = await Trainer(
        tmp_path, "jreq", nats_url=nats_server.url, names=bus.names, steps=100_000, step_sleep=0.02
    ).start()
    try:
        await registered(bus, "jreq")
        await request(bus, "jreq")
        got = await answers(acks, 2)
    finally:
        await t.kill()
        await acks.aclose()
    assert all(isinstance(a, CheckpointDurable) for a in got), [a.data for a in got]
    assert {a.data.rank for a in got} == {0, 1}
    assert len({a.data.step for a in got}) == 1  # one step for all ranks
    assert {a.data.request_id for a in got} == {"req-1"} and {a.data.saga_id for a in got} == {"saga-t"}
    commit = verify_checkpoint(got[0].data.path)
    assert commit["step"] == got[0].data.step and commit["world_size"] == 2
    assert commit["saga_id"] == "saga-t"  # a restore tells the coordinator which outage it ends
    assert sum(a.data.bytes for a in got) > 0 and all(a.data.durations.total_s > 0 for a in got)


async def test_with_millisecond_steps_the_ranks_agree_rarely_and_still_checkpoint_one_step(bus, nats_server, tmp_path):
    """Steps of ~1 ms: the ranks agree about every 20 ms of training (agree_every_s), not at each
    boundary, and a request still gives every rank a checkpoint of the same step."""
    acks = bus.subscribe(CheckpointDurable, CheckpointFailed, deliver="all")
    await acks.start()
    t = await Trainer(
        tmp_path, "jfast", nats_url=nats_server.url, names=bus.names, steps=4000, step_sleep=0.001
    ).start()
    try:
        await registered(bus, "jfast")
        await request(bus, "jfast")
        got = await answers(acks, 2)
        assert await t.wait(120) == 0, t.output()[-3000:]
    finally:
        await t.kill()
        await acks.aclose()
    assert all(isinstance(a, CheckpointDurable) for a in got), [a.data for a in got]
    assert {a.data.rank for a in got} == {0, 1} and len({a.data.step for a in got}) == 1
    counts = [tuple(map(int, m)) for m in re.findall(r"(\d+) step agreements over (\d+) step boundaries", t.output())]
    assert len(counts) == 2, t.output()[-3000:]
    assert all(agreed * 4 < boundaries for agreed, boundaries in counts), counts


async def test_the_remote_copy_raises_every_ranks_ack_to_durability_remote(bus, nats_server, tmp_path):
    acks = bus.subscribe(CheckpointDurable, deliver="all")
    await acks.start()
    remote = f"file://{tmp_path / 'nas'}"
    t = await Trainer(
        tmp_path, "jrem", nats_url=nats_server.url, names=bus.names, steps=100_000, step_sleep=0.02, remote_url=remote
    ).start()
    try:
        await registered(bus, "jrem")
        await request(bus, "jrem")
        got = await answers(acks, 4)  # each rank's local ack, then rank 0 raises both to remote
    finally:
        await t.kill()
        await acks.aclose()
    local = [a.data for a in got if a.data.durability == "local"]
    raised = [a.data for a in got if a.data.durability == "remote"]
    assert {a.rank for a in local} == {a.rank for a in raised} == {0, 1}
    assert {a.data.step for a in got} == {local[0].step} and {a.data.request_id for a in got} == {"req-1"}
    assert all(a.tier == "remote" and a.path.startswith(str(tmp_path / "nas")) for a in raised)
    assert {a.rank: a.digest for a in local} == {a.rank: a.digest for a in raised}  # the same manifests
    assert verify_checkpoint(raised[0].path)["step"] == local[0].step


async def test_a_request_for_one_ack_per_job_is_answered_by_rank_0_for_every_rank(bus, nats_server, tmp_path):
    """The coordinator asks for one ack per job: rank 0 answers for both ranks (local, then its
    remote copy's raise), rank 1 sends nothing. A per-rank request after it shows rank 1 had
    its turn: its ack to that one comes after anything it would have said to the first."""
    acks = bus.subscribe(CheckpointDurable, CheckpointFailed, deliver="all")
    await acks.start()
    remote = f"file://{tmp_path / 'nas'}"
    t = await Trainer(
        tmp_path, "jjob", nats_url=nats_server.url, names=bus.names, steps=100_000, step_sleep=0.02, remote_url=remote
    ).start()
    got = []
    try:
        await registered(bus, "jjob")
        await request(bus, "jjob", acks="job")
        got += await answers(acks, 2)  # rank 0's ack for the job, then its raise to remote
        await request(bus, "jjob", rid="req-2")
        while {a.data.rank for a in got if a.data.request_id == "req-2" and a.data.durability == "local"} != {0, 1}:
            got += await answers(acks, 1)
    finally:
        await t.kill()
        await acks.aclose()
    assert all(isinstance(a, CheckpointDurable) for a in got), [a.data for a in got]
    first = [a.data for a in got if a.data.request_id == "req-1"]
    assert [(a.rank, a.ranks, a.durability) for a in first] == [(0, [(0, 1)], "local"), (0, [(0, 1)], "remote")]
    assert first[0].speaks_for() == [0, 1] and first[0].world_size == 2
    assert verify_checkpoint(first[0].path)["step"] == first[0].step == first[1].step


async def test_bit_exact_resume_after_sigkill_right_after_the_ack(bus, nats_server, tmp_path):
    """With a GradScaler (its scale doubling every 10 steps) registered as extra state."""
    reference = tmp_path / "a.pt"
    await run(tmp_path / "A", "jexact", steps=STEPS, out=reference, grad_scaler=True)
    acks = bus.subscribe(CheckpointDurable, deliver="all")
    await acks.start()
    b_dir = tmp_path / "B"
    b_dir.mkdir()
    progress = b_dir / "progress"
    t = await Trainer(
        b_dir,
        "jexact",
        nats_url=nats_server.url,
        names=bus.names,
        steps=STEPS,
        step_sleep=0.05,
        progress=progress,
        grad_scaler=True,
    ).start()
    try:
        await registered(bus, "jexact")
        while not progress.exists() or len(progress.read_text().splitlines()) < 20:  # mid-way through the run
            await asyncio.sleep(0.05)
        await request(bus, "jexact")
        got = await answers(acks, 2)
    finally:
        await t.kill()  # every process dies right after the ack
        await acks.aclose()
    step = got[0].data.step
    assert 0 < step < STEPS - 1
    resumed = bus.subscribe(JobResumed, deliver="new")  # not run B's own "started from step 0"
    await resumed.start()
    t2 = await run(
        b_dir, "jexact", nats_url=nats_server.url, names=bus.names, steps=STEPS, out=tmp_path / "b.pt", grad_scaler=True
    )
    (ev,) = await answers(resumed, 1)
    await resumed.aclose()
    assert f"restored step {step} from the local tier" in t2.output()
    assert ev.data.job == "jexact" and ev.data.step == step
    assert ev.data.saga_id == got[0].data.saga_id, "the resume must name the saga whose checkpoint it restored"
    assert equal_params(reference, tmp_path / "b.pt")


async def test_sigkill_before_commit_restores_the_previous_checkpoint(tmp_path):
    await run(tmp_path, "jcrash", steps=30, save_at=10)
    crashed = await Trainer(
        tmp_path, "jcrash", steps=60, save_at=40, env={"POWERGUARD_TEST_FAILPOINT": "before_commit"}
    ).start()
    await crashed.wait()
    await crashed.kill()
    assert (tmp_path / "local" / "jcrash" / "step-40").is_dir()  # data written ...
    assert not (tmp_path / "local" / "jcrash" / "step-40" / "COMMIT").exists()  # ... never committed
    t = await run(tmp_path, "jcrash", steps=31)
    out = t.output()
    assert "skipping local checkpoint" in out and "step-40: no COMMIT" in out
    assert "restored step 10 from the local tier" in out


async def test_flipped_byte_falls_back_to_the_previous_checkpoint(tmp_path):
    await run(tmp_path, "jflip", steps=30, save_at=10)
    await run(tmp_path, "jflip", steps=60, save_at=40)
    victim = max((tmp_path / "local" / "jflip" / "step-40").glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    t = await run(tmp_path, "jflip", steps=41)
    out = t.output()
    assert "checksum mismatch" in out and victim.name in out
    assert "restored step 10 from the local tier" in out


async def test_local_tier_lost_restores_from_the_remote_tier(tmp_path):
    remote = f"file://{tmp_path / 'nas'}"
    # 40 short steps: agree often enough for periodic saves to happen in them (the default paces
    # agreements 0.5 s of training apart, and a periodic save is decided at an agreement)
    await run(
        tmp_path, "jremote", steps=40, local_every_s=0.01, remote_every_s=0.01, remote_url=remote, agree_every_s=0.01
    )
    copies = sorted((tmp_path / "nas" / "jremote").glob("step-*/COMMIT"))
    assert copies, "nothing reached the remote tier"
    newest = max(int(p.parent.name.split("-")[1]) for p in copies)
    shutil.rmtree(tmp_path / "local")
    t = await run(tmp_path, "jremote", steps=41, remote_url=remote)
    assert f"restored step {newest} from the remote tier" in t.output()


async def test_hung_rank_cannot_hang_the_checkpoint_past_its_deadline(bus, nats_server, tmp_path):
    acks = bus.subscribe(CheckpointDurable, CheckpointFailed, deliver="all")
    await acks.start()
    t = await Trainer(
        tmp_path,
        "jhang",
        nats_url=nats_server.url,
        names=bus.names,
        steps=100_000,
        step_sleep=0.01,
        hang_rank=1,
        hang_step=15,
        progress=tmp_path / "progress",
    ).start()
    try:
        await registered(bus, "jhang")
        progress = tmp_path / "progress"
        while "\n1 14 " not in "\n" + (progress.read_text() if progress.exists() else ""):  # rank 1 reached its hang
            await asyncio.sleep(0.05)
        await request(bus, "jhang", deadline_s=2.0)
        got = await answers(acks, 2, timeout=20)
    finally:
        await t.kill()
        await acks.aclose()
    assert all(isinstance(a, CheckpointFailed) for a in got)
    assert {a.data.rank for a in got} == {0, 1}
    assert all("did not reach a step boundary" in a.data.error for a in got)


async def test_http_trigger_publishes_a_manual_request(bus, nats_server, tmp_path):
    """Only a JSON request naming loopback is taken. Before: a cross-site POST (Origin and Host
    evil.example, text/plain, empty body: what a web page in a browser on the node can send
    without a CORS preflight) was answered 202 with a request on the bus."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    acks = bus.subscribe(CheckpointDurable, deliver="all")
    await acks.start()
    (tmp_path / "token").write_text("s3cret\n")
    (tmp_path / "token").chmod(0o600)
    t = await Trainer(
        tmp_path,
        "jhttp",
        nats_url=nats_server.url,
        names=bus.names,
        steps=100_000,
        step_sleep=0.02,
        http_port=port,
        env={"POWERGUARD_TRIGGER_TOKEN_FILE": str(tmp_path / "token")},
    ).start()
    url = f"http://127.0.0.1:{port}/api/v1/trigger_checkpoint"

    def post(headers: dict[str, str], data: bytes = b"") -> tuple[int, str]:
        req = urllib.request.Request(url, data=data, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    json_type = {"Content-Type": "application/json", "Authorization": "Bearer s3cret"}
    try:
        await registered(bus, "jhttp")

        async def listening() -> bool:  # the endpoint comes up with rank 0's agent
            try:
                await asyncio.to_thread(post, {})
                return True
            except OSError:
                return False

        await eventually(listening, 5, "rank 0's HTTP trigger endpoint")
        refused = [
            ({"Content-Type": "text/plain", "Origin": "http://evil.example", "Host": "evil.example"}, 421),
            ({"Content-Type": "text/plain", "Authorization": "Bearer s3cret"}, 415),
            ({"Authorization": "Bearer s3cret"}, 415),
            ({**json_type, "Host": "evil.example"}, 421),
            ({**json_type, "Origin": "https://evil.example"}, 421),
            ({**json_type, "Authorization": "Bearer wrong"}, 401),
            ({"Content-Type": "application/json"}, 401),
        ]
        for headers, code in refused:
            got_code, body = await asyncio.to_thread(post, headers)
            assert got_code == code, (headers, got_code, body)
        code, body = await asyncio.to_thread(post, json_type, b"{}")
        assert code == 202, body
        rid = json.loads(body)["request_id"]
        # every refused request was answered before this one was published: one request stored
        info = await bus.js.stream_info(bus.names.jobs_stream, subjects_filter=bus.subjects.ckpt_trigger("jhttp"))
        assert info.state.subjects == {bus.subjects.ckpt_trigger("jhttp"): 1}
        got = await answers(acks, 2)
    finally:
        await t.kill()
        await acks.aclose()
    assert {a.data.rank for a in got} == {0, 1}
    assert {a.data.request_id for a in got} == {rid}


async def test_a_committed_step_that_fails_its_check_is_written_again_not_acked_from_its_old_commit(tmp_path):
    """Step 40 committed, then a byte of its largest file flipped: the restart refuses it and
    resumes from step 10; its own save of step 40 must write the step anew (the bad one set
    aside, named), not ack the old COMMIT without a write, so the next restart restores 40."""
    await run(tmp_path, "jredo", steps=30, save_at=10)
    await run(tmp_path, "jredo", steps=60, save_at=40)
    step40 = tmp_path / "local" / "jredo" / "step-40"
    victim = max(step40.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    again = (await run(tmp_path, "jredo", steps=60, save_at=40)).output()
    assert "restored step 10 from the local tier" in again
    assert "set aside as" in again and victim.name in again, again[-3000:]
    assert len(list((tmp_path / "local" / "jredo").glob("step-40.refused-*"))) == 1  # kept for a post-mortem
    out = (await run(tmp_path, "jredo", steps=41)).output()
    assert "restored step 40 from the local tier" in out, out[-3000:]


async def test_a_shared_tier_the_ranks_do_not_share_is_refused_at_start_by_name(tmp_path):
    """``local_scope="shared"`` with each rank's ``local_dir`` on its own disk (a mount missing on
    a node): the job stops at start naming the rank, its node and its path, before any save can
    claim a shared tier (before, rank 0 acked step 10 ``durable`` and rank 1's directory held no
    COMMIT: no restore could use it)."""
    t = await Trainer(
        tmp_path,
        "jsplit",
        steps=20,
        save_at=10,
        nodes="n0,n1",
        local_scope="shared",
        local_dir=str(tmp_path / "local" / "{node}"),
    ).start()
    assert await t.wait() != 0
    out = t.output()
    assert "TierNotShared" in out and "do not share one directory" in out, out[-3000:]
    assert "rank 1 (node n1) does not see rank 0's" in out and str(tmp_path / "local" / "n1") in out
    assert not list((tmp_path / "local").glob("*/jsplit/step-*"))  # nothing saved, nothing claimed
