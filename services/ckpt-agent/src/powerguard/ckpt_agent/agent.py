"""``CheckpointAgent``: consistent, durable, two-tier checkpoints inside every training rank.

guard = CheckpointAgent(job="llama-7b", model=model, optimizer=opt, scheduler=sched,
                        local_dir="/nvme/ckpt", remote_url="file:///nas/ckpt", nats_url=...)
start = guard.restore()              # newest valid committed checkpoint (local, then remote)
for step in range(start, total_steps):
    train_step(...)
    guard.step(step)                 # power-event and periodic checkpoints
guard.close()
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import weakref
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from powerguard.bus import BusNames
from powerguard.schemas import (
    HOLD_POLICIES,
    AgentData,
    CheckpointRequestData,
    HoldPolicy,
)

from . import _layout as L
from . import _spans
from ._acks import Saved, _AckMixin
from ._bus import BusThread, Request
from ._framework import FRAMEWORKS, Due, _FrameworkMixin
from ._hashing import HashingWriter
from ._node_tier import _NodeTierMixin
from ._nodes import Topology
from ._remote import RemoteCopier
from ._restore import _RestoreMixin
from ._staging import ReusingStager, partition_replicated
from ._state import _StateMixin
from .errors import CheckpointError, CommitError, StepAgreementTimeout

log = logging.getLogger("powerguard.ckpt_agent")

CLOSE_AGREEMENT_WAIT_S = 2.0  # close(): how long the last boundary's agreement may still take
REPLICA_TIMEOUT_S = 120.0  # a peer that stops answering ends that replication (the local commit stands)
MAX_AGREEMENT_GAP = 10_000  # boundaries between two agreements at most, whatever the step time
AGREE_FLOOR_S = 10.0  # the others reach a step boundary within a step: wait at least this long


class CheckpointAgent(_StateMixin, _AckMixin, _RestoreMixin, _NodeTierMixin, _FrameworkMixin):
    """One per rank. ``torch.distributed`` must be initialized first (or run single-process).

    Keyword-only arguments:
      job, model, optimizer, scheduler: what to checkpoint (DDP and FSDP2 models work).
      extra_state: job-wide extras (``Stateful`` objects or plain values), saved once.
      rank_state: per-rank extras (e.g. a data loader position), saved under a per-rank key.
      local_dir: local tier root. ``local_scope="shared"`` (default): one directory every rank of
        the job sees. ``"node"``: each node's own disk (NVMe); every node keeps a checkpoint it
        can restore from by itself, plus replicas of ``replicas`` other nodes' files.
      local_scope: ``"shared"`` or ``"node"`` (see local_dir).
      replicas: node scope: how many other nodes keep a copy of each node's files (default 1).
      pipelined_agreement: start the step agreement at one agreement boundary and read it at the
        next (default): the all-reduce runs while the ranks train, so ``step()`` only reads a
        finished result; a request is acted on one agreement later, by every rank at the same
        step. False: agree and act at the same boundary (the training thread waits for it).
      reshard: restore a checkpoint written by more ranks than this job has (a node that stayed
        dead): DCP reshards model and optimizer; rank r keeps old rank r's RNG and rank state;
        not a bit-exact resume (the data order changes with the world size). Default: refused.
      remote_url: optional fsspec URL of the remote tier (``file:///nas/ckpt``, ``s3://...``).
      nats_url / names: the bus (None: no bus; checkpoints are periodic or explicit only).
      nats_creds: this job's NATS credential (``powerguard creds issue --job JOB``; default: env
        ``NATS_CREDS``). It lets the ranks talk about their own job only; TLS from ``NATS_CA``,
        ``NATS_CERT``, ``NATS_KEY``.
      node: this rank's node name as in the site YAML (default: the host name).
      local_every_s / remote_every_s: periodic checkpoints (async) and remote copies; 0 disables.
      keep / keep_remote: committed checkpoints kept per tier.
      sync_every_n_steps: agree on checkpoints at least N steps apart (the fewest steps between two).
      agree_every_s: with steps shorter than this, let several steps pass between two agreements,
        about this much training time (the ranks agree on how many: the shortest any proposes), so
        ``step()`` costs a counter increment in between; a request waits at most about this long
        more (twice with the pipelined agreement). 0: agree every ``sync_every_n_steps``.
        Default 0.5 s: a power request waits at most about 1 s more, against a budget of tens of
        seconds; a job with millisecond steps spends almost nothing on the agreement.
      http_port: on rank 0, serve ``POST /api/v1/trigger_checkpoint`` (the apcupsd-script interface).
      agree_timeout_s: how long a rank waits for the others at a step boundary with no request pending.
      overlap_staging: periodic saves copy parameters and optimizer state in the background while
        the next forward/backward runs; the next ``optimizer.step()`` waits for the copy. Needs
        parameters and optimizer state to change only in ``optimizer.step()`` (turn it off if
        your loop writes to them elsewhere).
      hold_policy: this job's hold policy, overriding the site's (``checkpoint-at-stop``, ``pause``,
        ``continue``; None: the site's). When a request says so (``then="pause"``), every rank
        waits inside ``step()`` after the checkpoint until a release (power back) or until the
        job is stopped; see :meth:`step`.
      pause_poll_s: how often paused ranks check, together, whether they may train on.
      framework: ``"lightning"`` or ``"hf"``: the framework writes the checkpoints (its callback in
        :mod:`powerguard.ckpt_agent.lightning` / :mod:`powerguard.ckpt_agent.hf` sets this); a
        request agreed at a step becomes :attr:`due`, the framework saves, :meth:`finish_due`
        commits and acks. No periodic saves (the framework keeps its own schedule), no remote tier.
    """

    def __init__(
        self,
        *,
        job: str,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any | None = None,
        extra_state: dict[str, Any] | None = None,
        rank_state: dict[str, Any] | None = None,
        local_dir: str | os.PathLike,
        remote_url: str | None = None,
        nats_url: str | None = None,
        nats_creds: str | os.PathLike | None = None,
        names: BusNames | None = None,
        node: str | None = None,
        local_every_s: float = 300.0,
        remote_every_s: float = 1800.0,
        keep: int = 3,
        keep_remote: int = 3,
        sync_every_n_steps: int = 1,
        overlap_staging: bool = True,
        http_port: int | None = None,
        heartbeat_s: float = 5.0,
        agree_timeout_s: float = 1800.0,
        hold_policy: HoldPolicy | None = None,
        pause_poll_s: float = 0.2,
        checksum_key_file: str | os.PathLike | None = None,
        local_scope: str = "shared",
        replicas: int = 1,
        reshard: bool = False,
        pipelined_agreement: bool = True,
        agree_every_s: float = 0.5,
        framework: str | None = None,
    ) -> None:
        if framework is not None:
            if framework not in FRAMEWORKS:
                raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, not {framework!r}")
            if remote_url or local_scope != "shared":
                raise ValueError(
                    "a framework's checkpoints have the shared local tier only (no remote_url, no node scope)"
                )
            local_every_s, overlap_staging = 0.0, False
        self.framework = framework
        self._due: Due | None = None
        if local_scope not in ("shared", "node"):
            raise ValueError(f"local_scope must be 'shared' or 'node', not {local_scope!r}")
        if replicas < 0:
            raise ValueError("replicas must be at least 0")
        if keep < 1 or keep_remote < 1:
            raise ValueError("keep and keep_remote must be at least 1")
        if sync_every_n_steps < 1:
            raise ValueError("sync_every_n_steps must be at least 1")
        if agree_every_s < 0:
            raise ValueError("agree_every_s must be at least 0")
        self.job = job
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.extra_state = dict(extra_state or {})
        self.rank_state = dict(rank_state or {})
        self.local_root = os.path.abspath(os.fspath(local_dir))
        # the site's checkpoint key: keyed digests on save, and a restore trusts only what it signed
        key_file = checksum_key_file or os.environ.get("POWERGUARD_CKPT_KEY_FILE")
        self._key: bytes | None = L.load_key(key_file) if key_file else None
        self.remote_url = remote_url
        self.local_every_s, self.remote_every_s = local_every_s, remote_every_s
        self.keep, self.keep_remote = keep, keep_remote
        self.sync_every_n_steps = sync_every_n_steps
        self.agree_every_s = agree_every_s
        self.agree_timeout_s = agree_timeout_s
        if hold_policy is not None and hold_policy not in HOLD_POLICIES:
            raise ValueError(f"hold_policy must be one of {', '.join(HOLD_POLICIES)}, not {hold_policy!r}")
        self.hold_policy = hold_policy
        self.pause_poll_s = pause_poll_s
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        # dedicated gloo groups: one for the step agreement (training thread), one for DCP and the
        # commit (also used by async saves' background thread); never the training's own group
        self._agree_group = dist.new_group(backend="gloo") if self.distributed else None
        self._save_group = dist.new_group(backend="gloo") if self.distributed else None
        self._local_fs, _ = L.fs_for(self.local_root)
        self.node = node or socket.gethostname().split(".")[0]
        self.local_scope, self.replicas, self.reshard = local_scope, replicas, reshard
        # node scope: which node each rank is on, and a group for replication (leaders, background)
        self._topo = Topology(tuple(self._gather(self.node)))
        self._replica_group = (
            dist.new_group(backend="gloo", timeout=timedelta(seconds=REPLICA_TIMEOUT_S))
            if self.distributed and local_scope == "node"
            else None
        )
        self._replicator: threading.Thread | None = None
        self.replicated: tuple[str, bool, list[str]] | None = None  # (directory, complete, problems), last one
        self.last_committed_step: int | None = None
        self._last_local = time.monotonic()
        self._step = 0
        self._boundary = 0
        self._next_agreement = 1  # the boundary of the next agreement
        self._gap = sync_every_n_steps  # boundaries between agreements, as last agreed
        self._boundary_t: float | None = None  # when the last boundary was reached
        self._step_s: float | None = None  # a step's duration (moving average), for the proposed gap
        # the agreement started at the last boundary, read at the next: (work, flags, pending request)
        self._inflight: tuple[Any, torch.Tensor, Request | None] | None = None
        # the agreement started at one boundary and read at the next (opt-in: see the README's Limits)
        self._pipelined = pipelined_agreement
        self._async: tuple[int, Future, HashingWriter, float] | None = None
        overlap = overlap_staging and optimizer is not None
        # weak references only: a cycle through the stager or the optimizer would keep the agent and
        # its gloo process groups alive until interpreter shutdown, where destroying them aborts
        stable = weakref.WeakMethod(self._stable_storages)
        self._stager = ReusingStager(stable=(lambda: ((m := stable()) and m()) or set()) if overlap else None)
        self._hook = None
        if overlap:
            before = weakref.WeakMethod(self._before_optimizer_step)
            self._hook = optimizer.register_step_pre_hook(lambda *a: (m := before()) and m(*a))
        self._retainer: threading.Thread | None = None
        self._resumed_reported = False
        self._restored: tuple[int, str] | None = None  # (step, tier) of the restored checkpoint
        self._restored_saga: str | None = None  # the saga whose request made it (its COMMIT says)
        self._saga_for_save: str | None = None  # the saga a save in progress answers
        self.stats: dict[str, float] = {}
        self._bus: BusThread | None = None
        if nats_url:
            from powerguard.bus.tracing import configure_tracing

            configure_tracing("powerguard-ckpt-agent")  # exports only when OTEL_* env asks for it
            agent = AgentData(
                job=job,
                rank=self.rank,
                world_size=self.world_size,
                node=self.node,
                tiers=["local", "remote"] if remote_url else ["local"],
                hold_policy=hold_policy,
            )
            from powerguard.bus.env import auth_options

            auth = auth_options()
            if nats_creds is not None:
                auth["creds_file"] = os.fspath(nats_creds)
            self._bus = BusThread(
                url=nats_url, names=names or BusNames(), agent=agent, heartbeat_s=heartbeat_s, auth=auth
            )
            self._bus.start()
            if http_port is not None and self.rank == 0:
                from ._http import serve_trigger

                self._http = self._bus.run(serve_trigger(self._bus, port=http_port))  # keep the runner alive
        self._remote = None
        if remote_url and self.rank == 0:
            self._remote = RemoteCopier(self.local_root, remote_url, job=job, keep=keep_remote, every_s=remote_every_s)
            self._remote.on_copied = self._answer_remote
        self._remote_waiting: dict[int, list[CheckpointRequestData]] = {}  # step -> requests to ack "remote"

    # ------------------------------------------------------------------ collectives
    def _barrier_ok(self, ok: bool, timeout_s: float | None = None) -> bool:
        """All ranks agree that every rank succeeded (MIN of a flag)."""
        if not self.distributed:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
        self._wait(dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._save_group, async_op=True), timeout_s)
        return bool(flag.item())

    def _wait(self, work, timeout_s: float | None) -> None:
        if timeout_s is None:
            work.wait()
            return
        try:
            work.wait(timedelta(seconds=max(0.01, timeout_s)))
        except RuntimeError as exc:
            raise StepAgreementTimeout(
                f"rank {self.rank}: not every rank reached the step boundary within {timeout_s:.1f}s "
                f"(a rank is hung or gone): {exc}"
            ) from None

    def _gather(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._save_group)
        return out

    # ------------------------------------------------------------------ training loop hook
    def step(self, step: int) -> None:
        """Call after each optimizer step with that step's number. Cheap when nothing is due. With
        ``pipelined_agreement=True`` the ranks' agreement is an all-reduce started at one boundary
        and read at the next (it runs while the step trains), so a request is acted on at the
        boundary after the one where a rank first reports it, by every rank at that same step.

        When the coordinator asks for a checkpoint followed by a pause (the ``pause`` hold policy,
        or the final checkpoint before a shutdown), this call does not return until the ranks are
        released (power came back: training continues in place, nothing is lost) or the job is
        stopped (SIGTERM, as on any stop). While paused, the training's own process groups see no
        collective at all (DDP's all-reduce finished in the backward pass; an idle NCCL/gloo
        communicator has no timeout), only this agent's own gloo group, every ``pause_poll_s``, so
        all ranks leave the pause at the same boundary; heartbeats go on and report the pause.
        Wall-clock timers of the training (time limits, throughput meters) count the pause."""
        self._step = step
        if self._bus is not None:
            self._bus.step = step
            if not self._resumed_reported:
                self.report_resumed()
        self._boundary += 1
        now = time.monotonic()
        if self._boundary_t is not None:
            took = now - self._boundary_t
            self._step_s = took if self._step_s is None else 0.8 * self._step_s + 0.2 * took
        self._boundary_t = now
        if self._boundary < self._next_agreement:
            return
        try:
            self._agree(step)
        finally:
            self._next_agreement = self._boundary + self._gap

    def _agree(self, step: int) -> None:
        """The agreement at this boundary (see :meth:`step`)."""
        self.stats["agreements"] = self.stats.get("agreements", 0) + 1
        if not self.distributed:  # one rank: what it sees is what all agree on
            pending = self._bus.pending() if self._bus is not None else None
            self._act(step, self._flags(pending), pending)
            return
        if not self._pipelined:  # agree and act at this very boundary (benchmarks compare the two)
            pending = self._bus.pending() if self._bus is not None else None
            self._inflight = (
                dist.all_reduce(
                    flags := self._flags(pending), op=dist.ReduceOp.MAX, group=self._agree_group, async_op=True
                ),
                flags,
                pending,
            )
        # The agreement runs off the training thread's critical path: what the ranks said at the
        # last boundary was all-reduced during the step just trained; act on it now (every rank
        # acts on the same flags, so every rank checkpoints this same step), then start the next.
        prev, self._inflight = self._inflight, None
        if prev is not None:
            work, flags, pending = prev
            # a request bounds how long this rank waits for the others, but never below
            # AGREE_FLOOR_S: a deadline that has passed (low battery) means "checkpoint now"
            timeout = max(AGREE_FLOOR_S, pending.deadline_ts - time.time()) if pending else self.agree_timeout_s
            try:
                self._wait(work, timeout)
            except StepAgreementTimeout as exc:
                if pending is not None:
                    self._answer_failed([pending.data], exc)
                raise
            self._act(step, flags, self._bus.pending() if self._bus is not None else None)
            if not self._pipelined:
                return
        pending = self._bus.pending() if self._bus is not None else None
        flags = self._flags(pending)
        work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._agree_group, async_op=True)
        self._inflight = (work, flags, pending)

    def _proposed_gap(self) -> int:
        """Boundaries until the next agreement this rank proposes: about ``agree_every_s`` of steps."""
        if self.agree_every_s <= 0 or not self._step_s:
            return self.sync_every_n_steps
        return max(self.sync_every_n_steps, min(MAX_AGREEMENT_GAP, int(self.agree_every_s / self._step_s)))

    def _flags(self, pending: Request | None = None) -> torch.Tensor:
        """What this rank wants at a boundary: a request pending, a periodic save due (rank 0's
        clock), a periodic save still writing, a periodic save to commit; and, negated (the
        all-reduce takes the maximum: this gives the minimum), the gap to the next agreement."""
        periodic = (
            self.rank == 0 and self.local_every_s > 0 and time.monotonic() - self._last_local >= self.local_every_s
        )
        async_busy = self._async is not None and not self._async[1].done()
        return torch.tensor(
            [
                1 if pending else 0,
                1 if periodic else 0,
                1 if async_busy else 0,
                1 if self._async is not None else 0,
                -self._proposed_gap(),
            ],
            dtype=torch.int64,
        )

    def _act(self, step: int, flags: torch.Tensor, pending: Request | None) -> None:
        """Do what the agreed ``flags`` say, at this step, on every rank alike."""
        values = flags.tolist()
        self._gap = -values[4]  # every rank read the same: the next agreement at the same boundary
        want_request, want_periodic, any_busy, any_async = (bool(x) for x in values[:4])
        if any_async and not any_busy and self._async is not None:  # (``wait()`` may have finished it since)
            self._finish_async()
        if want_request and self.framework is not None:
            self._defer(step, pending)
        elif want_request:
            requests, ok = self._checkpoint_for_requests(step, pending)
            if ok and any(r.then == "pause" for r in requests):
                self._pause(step, requests)
        elif want_periodic and not any_async:
            self._start_async(step)
        if self._remote is not None:
            self._remote.maybe_copy(self.last_committed_step)

    def _pause(self, step: int, requests: list[CheckpointRequestData]) -> None:
        """Wait at this step boundary, all ranks together, until released (or ``pause_max_s``)."""
        sagas = {r.saga_id for r in requests}
        limits = [r.pause_max_s for r in requests if r.pause_max_s]
        limit = min(limits) if limits else None
        log.info("rank %d: paused at step %d after the checkpoint (until power returns or the stop)", self.rank, step)
        t0 = time.monotonic()
        if self._bus is not None:
            self._bus.set_paused(step)
        try:
            while True:
                released = self._bus is None or self._bus.released(sagas)
                if limit is not None and time.monotonic() - t0 >= limit and not released:
                    log.warning("rank %d: no release after %.0fs paused; training on", self.rank, limit)
                    released = True
                pending = self._bus.pending() if self._bus is not None else None
                flags = torch.tensor([1 if released else 0, 1 if pending else 0], dtype=torch.int64)
                if self.distributed:
                    self._wait(
                        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._agree_group, async_op=True),
                        max(60.0, 10 * self.pause_poll_s),
                    )
                go, another = (bool(x) for x in flags.tolist())
                if another:  # a request while paused: the state has not changed since the checkpoint
                    self._checkpoint_for_requests(step, pending)
                if go:
                    break
                time.sleep(self.pause_poll_s)
        finally:
            self.stats["paused_s"] = self.stats.get("paused_s", 0.0) + time.monotonic() - t0
            if self._bus is not None:
                self._bus.set_paused(None)
        log.info("rank %d: released at step %d after %.1fs paused", self.rank, step, time.monotonic() - t0)

    def _checkpoint_for_requests(self, step: int, pending: Request | None) -> tuple[list[CheckpointRequestData], bool]:
        """One checkpoint of ``step`` for every rank's pending requests; returns them and whether
        the checkpoint is durable."""
        agreed = self._agreed_requests(step, pending)
        if agreed is None:  # agreed on a request that every rank has answered since (pipelined agreement)
            return [], False
        requests, span, first_seen, t_agree = agreed
        try:
            if self._async is not None:  # finish the periodic save first: one save at a time on the group
                self._async[1].result()
                self._finish_async()
            self._saga_for_save = next((r.saga_id for r in requests.values() if r.saga_id), None)
            try:
                info = self.save(step)
            except CheckpointError as exc:
                _spans.failed(span, exc)
                self._answer_failed(list(requests.values()), exc, ctx=_spans.inside(span))
                return list(requests.values()), False
            finally:
                self._saga_for_save = None
            info.agree_s = max(0.0, t_agree - first_seen)
            span.set_attribute("powerguard.bytes", info.bytes)
            self._answer_durable(list(requests.values()), step, info, ctx=_spans.inside(span))
        finally:
            span.end()
        if self._remote is not None:
            deadlines = [r.deadline.timestamp() for r in requests.values()]
            if self._bus is not None:
                self._remote_waiting[step] = list(requests.values())  # raised to "remote" once copied
            if not self._remote.copy_if_time_allows(step, min(deadlines) if deadlines else None):
                self._remote_waiting.pop(step, None)
        return list(requests.values()), True

    def _agreed_requests(
        self, step: int, pending: Request | None
    ) -> tuple[dict[str, CheckpointRequestData], Any, float, float] | None:
        """Every rank's pending request, gathered (one checkpoint serves them all), and the span of
        that checkpoint: (requests by id, span, when this rank first saw one, when they agreed);
        None when every rank has answered them since."""
        t_agree = time.time()
        gathered = self._gather([(pending.data, pending.traceparent)] if pending else [])
        requests = {data.request_id: data for rs in gathered for data, _ in rs}
        if not requests:
            return None
        first_seen = pending.received if pending else t_agree
        span = _spans.start(
            f"checkpoint {self.job}",
            _spans.parent(tp for rs in gathered for _, tp in rs),
            first_seen,
            **{
                "powerguard.job": self.job,
                "powerguard.rank": self.rank,
                "powerguard.world_size": self.world_size,
                "powerguard.step": step,
                "powerguard.framework": self.framework,
                "powerguard.saga_id": next(iter(requests.values())).saga_id,
            },
        )
        return requests, span, first_seen, t_agree

    # ------------------------------------------------------------------ saving
    def save(self, step: int) -> Saved:
        """Synchronous durable checkpoint of ``step`` on every rank (all ranks must call it)."""
        self._step = step
        t0 = time.perf_counter()
        directory = L.step_dir(self.local_root, self.job, step)
        committed, problem = False, None
        if self._node_leader:
            try:
                if os.path.isdir(directory) and not os.path.exists(os.path.join(directory, L.COMMIT)):
                    log.warning("removing uncommitted leftover %s", directory)
                    self._local_fs.rm(directory, recursive=True)
                L.makedirs_durable(directory)
                committed = os.path.exists(os.path.join(directory, L.COMMIT))
            except OSError as exc:  # every rank must hear it: the others would wait in DCP's collectives
                problem = f"rank {self.rank} (node {self.node}): cannot prepare {directory}: {exc}"
        else:
            committed = True  # only the leaders' answers count
        answers = self._gather((committed, problem))
        committed = all(c for c, _ in answers)
        problem = "; ".join(p for _, p in answers if p)
        if problem:
            raise CommitError(problem)
        if committed:  # this exact step is already durable (e.g. a periodic save of the same step)
            return self._existing_info(directory, step, time.perf_counter() - t0)
        writer = HashingWriter(directory, sync_files=True, key=self._key)
        try:
            dcp.save(self._state_dict(), storage_writer=writer, process_group=self._save_group)
            ok, err = True, None
        except BaseException as exc:  # CheckpointException derives from BaseException
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            ok, err = False, exc
        t_write = time.perf_counter()
        return self._commit(directory, step, writer, ok, err, t0, t_write)

    def _commit(
        self,
        directory: str,
        step: int,
        writer: HashingWriter,
        ok: bool,
        err: BaseException | None,
        t0: float,
        t_write: float,
    ) -> Saved:
        digest, nbytes, keyed = "", 0, None
        if ok:
            try:
                digest, nbytes, keyed = L.write_manifest(
                    self._local_fs, directory, self.rank, step, writer.data_files(), key=self._key
                )
            except OSError as exc:
                ok, err = False, exc
        body = meta = None
        if ok and self.local_scope == "node":  # every node stores every manifest and the metadata
            try:
                with open(os.path.join(directory, L.manifest_name(self.rank)), "rb") as f:
                    body = f.read()
                if self.rank == 0:
                    with open(os.path.join(directory, ".metadata"), "rb") as f:
                        meta = f.read()
            except OSError as exc:
                ok, err = False, exc
        results = self._gather((self.rank, ok, digest, repr(err) if err else None, keyed, body, meta))
        failures = [f"rank {r}: {e}" for r, good, _, e, *_ in results if not good]
        if failures:
            raise CommitError(f"checkpoint {directory} not committed: {'; '.join(failures)}")
        if self.local_scope == "node":
            extra = {"saga_id": self._saga_for_save} if self._saga_for_save else None
            if not self._commit_on_every_node(directory, step, results, extra):
                raise CommitError(f"not every node could write COMMIT in {directory}")
            self._replicate_in_background(directory, results)
            saved = self._committed(directory, step, nbytes, digest, t0, t_write)
            saved.durability = self._durability
            return saved
        committed = True
        if self.rank == 0:
            try:
                with open(os.path.join(directory, ".metadata"), "rb") as f:
                    meta = f.read()
                L.write_commit(
                    self._local_fs,
                    directory,
                    step=step,
                    world_size=self.world_size,
                    digests={r: d for r, _, d, *_ in results},
                    metadata_digest=L.digest_bytes(meta),
                    extra={"saga_id": self._saga_for_save} if self._saga_for_save else None,
                    key=self._key,
                    keyed_manifests={r: k for r, _, _, _, k, *_ in results} if self._key is not None else None,
                    metadata=meta,
                )
                self._retain_in_background()
            except OSError as exc:
                log.error("rank 0: COMMIT of %s failed: %s", directory, exc)
                committed = False
        if not self._barrier_ok(committed):
            raise CommitError(f"rank 0 could not write COMMIT in {directory}")
        return self._committed(directory, step, nbytes, digest, t0, t_write)

    def _committed(self, directory: str, step: int, nbytes: int, digest: str, t0: float, t_write: float) -> Saved:
        t_end = time.perf_counter()
        self.last_committed_step = step
        self._last_local = time.monotonic()
        if self._bus is not None:
            self._bus.last_committed_step = step
        log.info(
            "rank %d: step %d durable in %s (%.1f MB, %.2fs)", self.rank, step, directory, nbytes / 1e6, t_end - t0
        )
        return Saved(directory, nbytes, digest, t_write - t0, t_end - t_write, t_end - t0)

    def _retain_in_background(self) -> None:
        """Old checkpoints are deleted off the critical path (rank 0, one at a time)."""
        if self._retainer is not None and self._retainer.is_alive():
            return  # the next commit will catch up

        def run() -> None:
            try:
                L.retain(self._local_fs, self.local_root, self.job, self.keep)
            except OSError as exc:
                log.warning("retention in %s failed: %s", self.local_root, exc)

        self._retainer = threading.Thread(target=run, name="pg-ckpt-retain", daemon=True)
        self._retainer.start()

    def _existing_info(self, directory: str, step: int, elapsed: float) -> Saved:
        with open(os.path.join(directory, L.manifest_name(self.rank)), "rb") as f:
            body = f.read()
        files = json.loads(body)["files"]
        return Saved(directory, sum(f["size"] for f in files.values()), L.digest_bytes(body), 0.0, elapsed, elapsed)

    def _stable_storages(self) -> set[int]:
        """Storages that change only in ``optimizer.step()``: parameters and optimizer state."""
        ptrs = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        for state in self.optimizer.state.values() if self.optimizer is not None else ():
            ptrs.update(t.untyped_storage().data_ptr() for t in state.values() if isinstance(t, torch.Tensor))
        return ptrs

    def _before_optimizer_step(self, *_: Any) -> None:
        """The optimizer is about to change what a background copy may still be reading."""
        staging = self._stager.staging
        if staging is not None and not staging.done():
            t0 = time.perf_counter()
            self._stager.wait_staged()
            self.stats["async_wait_s"] = self.stats.get("async_wait_s", 0.0) + time.perf_counter() - t0

    def _start_async(self, step: int) -> None:
        directory = L.step_dir(self.local_root, self.job, step)
        if self.rank == 0:
            L.makedirs_durable(directory)
        self._gather(None)  # the directory exists before anyone writes
        writer = HashingWriter(directory, sync_files=True, key=self._key)
        t0 = time.perf_counter()
        self.stats["async_wait_s"] = 0.0
        future = dcp.async_save(
            partition_replicated(self._state_dict(), rank=self.rank, world_size=self.world_size),
            storage_writer=writer,
            process_group=self._save_group,
            async_stager=self._stager,
        )
        future = getattr(future, "upload_completion", future)  # a staging Future gives an AsyncSaveResponse
        self.stats["async_stall_s"] = time.perf_counter() - t0
        self._async = (step, future, writer, t0)

    def _finish_async(self) -> None:
        step, future, writer, t0 = self._async
        self._async = None
        try:
            future.result()
            ok, err = True, None
        except BaseException as exc:
            ok, err = False, exc
        directory = L.step_dir(self.local_root, self.job, step)
        try:
            info = self._commit(directory, step, writer, ok, err, t0, time.perf_counter())
            self.stats["async_total_s"] = info.total_s
        except CheckpointError as exc:
            log.error("periodic checkpoint of step %d failed: %s", step, exc)
            self._last_local = time.monotonic()

    def wait(self) -> None:
        """Finish a periodic save in flight (all ranks must call it)."""
        if self._async is not None:
            self._async[1].result()
            self._finish_async()

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Finish a periodic save in flight, stop the remote copier, deregister."""
        if self._due is not None and self._due.watchdog is not None:  # a framework save never finished
            self._due.watchdog.cancel()
        log.info(
            "rank %d: %d step agreements over %d step boundaries",
            self.rank,
            self.stats.get("agreements", 0),
            self._boundary,
        )
        if self._inflight is not None:  # the last boundary's agreement: finished unless a peer stopped first
            work, self._inflight = self._inflight[0], None
            try:  # a stop (SIGTERM) reaches the ranks at different steps: never hold the stop up for it
                self._wait(work, CLOSE_AGREEMENT_WAIT_S)
            except StepAgreementTimeout:
                log.info("rank %d: the last step agreement was left unfinished (a peer stopped first)", self.rank)
        try:
            self.wait()
        finally:
            if self._hook is not None:
                self._hook.remove()
                self._hook = None
            self._stager.close()
            if self._remote is not None:
                self._remote.close()
            if self._bus is not None:
                self._bus.close()
            if self._retainer is not None:
                self._retainer.join(30)
            if self._replicator is not None and not self.wait_replicated(60):
                log.warning("rank %d: replication still running at close: the peers' copy may be short", self.rank)
            self._release_groups()

    def _release_groups(self) -> None:
        """Destroy this agent's own process groups while the job's are still up. Left to the
        garbage collector after the job's ``destroy_process_group()``, a gloo group's destructor
        hung now and then (1 of 4 ranks, ~3 runs in 4, torch 2.13, 4 ranks on 2 cores)."""
        groups = [self._agree_group, self._save_group]
        if self._replicator is None or not self._replicator.is_alive():  # else the copy keeps its group
            groups.append(self._replica_group)
            self._replica_group = None
        groups = [g for g in groups if g is not None]
        self._agree_group = self._save_group = None
        if not (self.distributed and dist.is_initialized()):
            return
        for group in groups:
            try:
                dist.destroy_process_group(group)
            except (RuntimeError, ValueError) as exc:  # already destroyed with the job's groups
                log.debug("rank %d: process group not destroyed: %s", self.rank, exc)

    def wait_replicated(self, timeout_s: float | None = None) -> bool:
        """Node scope: wait until the last checkpoint's replication to the peers ended; True when it
        ended (``replicated`` then says whether it was complete)."""
        if self._replicator is None:
            return True
        self._replicator.join(timeout_s)
        return not self._replicator.is_alive()

    def __enter__(self) -> CheckpointAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
