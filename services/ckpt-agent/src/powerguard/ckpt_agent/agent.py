"""``CheckpointAgent``: consistent, durable, two-tier checkpoints inside every training rank.

guard = CheckpointAgent(job="llama-7b", model=model, optimizer=opt, local_dir="/nvme/ckpt", nats_url=...)
start = guard.restore()  # newest valid committed checkpoint; then guard.step(step) after each step

A front class: settings checked once (``_config``), collaborators wired (``_wiring``) that
own their state, return values and hold no reference to the agent; the agent alone writes
its progress record (``_progress.Progress``). The README's "How it works" draws them.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import torch

from powerguard.bus import BusNames
from powerguard.schemas import CheckpointRequestData, HoldPolicy

from . import _layout as L
from ._acks import Saved
from ._agreement import Decision, StepAgreementFailed, Wants, agreed
from ._config import ARGUMENTS_DOC, AgentConfig
from ._framework import Due
from ._power import power_checkpoint
from ._quiet import Served
from ._restore import Floor, framework_restored, resumed
from ._wiring import BusOptions, TrainingParts, wire
from .errors import CheckpointError

log = logging.getLogger("powerguard.ckpt_agent")

CLOSE_AGREEMENT_WAIT_S = 2.0  # close(): how long the last boundary's agreement may still take


class CheckpointAgent:
    """One per rank. ``torch.distributed`` must be initialized first (or run single-process)."""

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
        remote_options: dict | None = None,
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
        allow_fresh_start: bool = False,
        writer_threads: int | None = None,
        allow_rollback: int | None = None,
    ) -> None:
        settings = {k: v for k, v in locals().items() if k in AgentConfig.ARGUMENTS}
        cfg = self.config = AgentConfig.checked(**settings)
        self.job, self.framework = cfg.job, cfg.framework
        p = wire(
            cfg,
            TrainingParts(model, optimizer, scheduler, extra_state, rank_state),
            node=node,
            bus=BusOptions(nats_url, nats_creds, names, heartbeat_s, http_port),
        )
        self.ranks, self.state, self.saver, self.agreement = p.ranks, p.state, p.saver, p.agreement
        self.restorer, self.nodes, self.acks, self.hold, self.frameworks = (
            p.restorer,
            p.nodes,
            p.acks,
            p.hold,
            p.frameworks,
        )
        self._bus, self._remote, self._retainer, self._http = p.bus, p.remote, p.retainer, p.http
        self.quiet = p.quiet
        self._closed = False
        self.rank, self.world_size, self.distributed, self.node, self.local_root = (
            p.ranks.rank,
            p.ranks.world_size,
            p.ranks.distributed,
            p.node,
            p.local_root,
        )
        self.progress = p.progress  # this class its only writer; the bus thread reads it

    # ------------------------------------------------------------------ progress
    @property
    def last_committed_step(self) -> int | None:
        return self.progress.last_committed_step

    @property
    def stats(self) -> dict[str, float]:
        p = self.progress
        out = {**self.saver.stats, "agreements": self.agreement.agreements, "paused_s": p.paused_s}
        return out | ({"restore_s": p.restored.seconds} if p.restored else {})

    @property
    def replicated(self) -> tuple[str, bool, list[str]] | None:
        """Node scope: (directory, complete, problems) of the last replication to the peers."""
        return self.nodes.replicated if self.nodes is not None else None

    def _committed(self, step: int, *, scheduled_copy: bool = False) -> None:
        """``scheduled_copy``: a checkpoint of the job's own (not a power request's, whose copy
        ``power_checkpoint`` weighs against the deadline) goes to the remote tier on its schedule
        now, not at the next agreed boundary: a job may end before there is one."""
        self.progress.last_committed_step = step
        if scheduled_copy and self._remote is not None:
            self._remote.maybe_copy(step)

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
        self.progress.step = step
        if self._bus is not None:
            if not self.progress.resumed_reported:
                self.report_resumed()
        stop, self.progress.boundary_at = self.config.check.at_step(self.rank, step, self.progress.boundary_at)
        if stop:  # under `powerguard check-resume`: the checkpoint, then the stop
            self.save(step)
            self.close()  # the agent's groups destroyed while the job's are up (a rank aborted at exit 1 in 7)
            raise SystemExit(0)
        if not self.agreement.boundary(time.monotonic()):
            return
        try:
            decision = self.agreement.agree(self._wants())
            if decision is not None:
                self._act(step, decision)
            self.agreement.start(self._wants())
        except StepAgreementFailed as exc:
            if exc.request is not None:
                self.acks.failed([exc.request.data], exc, step=step)
            raise
        finally:
            self.agreement.scheduled()

    def _wants(self) -> Wants:
        pending = self._bus.pending() if self._bus is not None else None
        s = self.saver
        return Wants(pending, s.periodic_due(time.monotonic()), s.writing, s.unfinished)

    def _act(self, step: int, d: Decision) -> None:
        """Do what the ranks agreed, at this step, on every rank alike."""
        pending = self._bus.pending() if self._bus is not None else None
        if d.unfinished and not d.busy and self.saver.unfinished:  # (``wait()`` may have finished it since)
            self.wait()
        if d.request and self.frameworks is not None:
            got = agreed(self.ranks, step, pending, job=self.job, framework=self.framework)
            if got is not None:
                self.frameworks.defer(step, got)
        elif d.request:
            requests, ok = self._checkpoint_for_requests(step, pending)
            if ok and any(r.then == "pause" for r in requests):
                self._pause(step, requests)
        elif d.periodic and not d.unfinished:
            self.saver.start(step)
        if self._remote is not None:
            self._remote.maybe_copy(self.last_committed_step)

    def _pause(self, step: int, requests: list[CheckpointRequestData]) -> None:
        """Wait at this step boundary, all ranks together, until released (or ``pause_max_s``)."""
        pause = self.hold.begin(step, requests)
        self._paused(step)
        try:
            while True:
                poll = self.hold.poll(pause)
                if poll.another:  # a request while paused: the state has not changed since the checkpoint
                    requests, ok = self._checkpoint_for_requests(step, poll.pending)
                    pause = self.hold.join(pause, requests) if ok else pause
                if poll.go:
                    break
                self.hold.wait(pause)
        finally:
            self.progress.paused_s += self.hold.end(pause)
            self._paused(None)

    def _paused(self, step: int | None) -> None:
        """Training waits at ``step`` (None: trains again); the registry hears it at once."""
        self.progress.paused_step = step
        if self._bus is not None:
            self._bus.beat_now()

    def _checkpoint_for_requests(self, step: int, pending: Any) -> tuple[list[CheckpointRequestData], bool]:
        """One checkpoint of ``step`` for every rank's pending requests; returns them and whether
        the checkpoint is durable."""
        got = agreed(self.ranks, step, pending, job=self.job, framework=self.framework)
        if got is None:  # agreed on a request that every rank has answered since (pipelined agreement)
            return [], False
        if self.saver.unfinished:  # finish the periodic save first: one save at a time on the group
            self.wait()
        self.progress.step = step
        info = power_checkpoint(got, step, saver=self.saver, acks=self.acks, remote=self._remote)
        if info is not None:
            self._committed(step)
        return got.requests, info is not None

    # ------------------------------------------------------------------ quiescent phases
    @contextlib.contextmanager
    def quiescent(self) -> Iterator[None]:
        """Around code that leaves the training state as it is (an evaluation, logging, a data
        reload): a checkpoint request that comes meanwhile is checkpointed at once, of the last
        step's state (``guard.step(step)`` was its last call), by a thread of the agent, every
        rank together, instead of waiting for the next step boundary past its deadline::

            guard.step(step)
            if step % eval_every == 0:
                with guard.quiescent():
                    evaluate(model)

        Every rank enters and leaves it at the same step (as around any collective code); one that
        leaves first waits there for the others. Inside, the model's parameters, the optimizer
        and the extra state must not change (read-only evaluation: ``model.eval()`` and
        ``torch.no_grad()``); the RNG is checkpointed as it was on entry. A request that asks the
        ranks to pause (the final checkpoint before a shutdown) pauses them on leaving, before the
        next step. Framework mode (Lightning, HF Trainer): the callbacks checkpoint at their own
        boundaries; this is a no-op there."""
        if self.frameworks is not None:
            yield
            return
        step = self.progress.step
        if not self.agreement.finish(self.config.agree_timeout_s):  # the pipelined one: its peers' too
            log.warning("rank %d: the step agreement before the quiescent phase was left unfinished", self.rank)
        self.state.freeze_rng()
        self.quiet.begin(lambda pending: self._serve_quiet(step, pending))
        try:
            yield
        finally:
            try:
                served = self.quiet.end()
            finally:
                self.state.thaw_rng()
        if any(s.durable for s in served):
            self._committed(step)
        pausing = [r for s in served if s.durable for r in s.requests if r.then == "pause"]
        if pausing:
            self._pause(step, pausing)

    def _serve_quiet(self, step: int, pending: Any) -> Served | None:
        """The quiescent phase's thread: one checkpoint of ``step`` for every rank's pending
        request (the training thread touches neither the saver nor the agent's groups meanwhile)."""
        got = agreed(self.ranks, step, pending, job=self.job, framework=self.framework)
        if got is None:
            return None
        if self.saver.unfinished:  # a periodic save in flight: committed first, one save at a time
            self.saver.finish()
        info = power_checkpoint(got, step, saver=self.saver, acks=self.acks, remote=self._remote)
        return Served(got.requests, info is not None)

    # ------------------------------------------------------------------ saving and restoring
    def save(self, step: int) -> Saved:
        """Synchronous durable checkpoint of ``step`` on every rank (all ranks must call it)."""
        self.progress.step = step
        info = self.saver.save(step)
        self._committed(step, scheduled_copy=True)
        return info

    def wait(self) -> None:
        """Finish a periodic save in flight (all ranks must call it)."""
        done = self.saver.finish()
        if done is not None:
            self._committed(done[0], scheduled_copy=True)

    def restore(self, *, own_step: int | None = None) -> int:
        """Load the newest valid committed checkpoint (node-local tier, local, then remote);
        return the step to run next (0 when there is none). Every skipped checkpoint is logged
        with its reason.

        ``own_step``: the job checkpoints on its own too and has restored its own checkpoint of
        this step already (nanoGPT's ``ckpt.pt``, a trainer's ``--resume``): PowerGuard's is
        loaded only when it is newer (it overwrites what the job loaded), else the job's state
        stands and the step after ``own_step`` is returned; the line at the start says which."""
        try:
            floor = self._floor()
            got = self.progress.restored = self.restorer.restore(own_step=own_step, floor=floor)
        finally:
            self.progress.restore_ended = time.time()
        if got is not None:
            self.progress.step = self.progress.last_committed_step = got.step
            return got.step + 1
        if own_step is not None:
            self.progress.step = own_step
            return own_step + 1
        return 0

    def _floor(self) -> Floor | None:
        """What the coordinator recorded for this job (rank 0 reads it on the bus, every rank gets
        it): a restore takes no older step unless ``allow_rollback`` names it. Without a bus, or
        with none recorded, None (and without a bus the rule cannot hold: rank 0 says so)."""
        got = None
        if self.rank == 0 and self._bus is not None:
            recorded = self._bus.recorded()
            if recorded is not None:
                got = Floor(recorded.step, recorded.commit, recorded.saga_id, self.config.allow_rollback)
        elif self.rank == 0 and self.config.key is not None:
            log.info("rank 0: no bus: the restore cannot check for a rollback (the coordinator's record is not read)")
        return self.ranks.gather(got)[0]

    def report_resumed(self) -> None:
        """Announce ``job.resumed`` once (rank 0), after the first step following a restore."""
        p = self.progress
        if p.resumed_reported or self._bus is None or self.rank != 0:
            return
        p.resumed_reported = True
        event, ctx = resumed(
            job=self.job, step=p.step, restored=p.restored, restore_ended=p.restore_ended, source=self._bus.source
        )
        self._bus.publish_nowait(event, ctx)

    # ------------------------------------------------------------------ framework mode
    @property
    def due(self) -> Due | None:
        """A checkpoint the ranks agreed on and the framework must now write (framework mode),
        the same on every rank after the same :meth:`step`; None when nothing is due."""
        return self.frameworks.due if self.frameworks is not None else None

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (an all-gather over the agent's own process group;
        every rank must call it). For a framework hook that needs what each rank holds (the
        Lightning callback gathers each rank's RNG state and whether it could prepare the save)."""
        return self.ranks.gather(obj)

    def restored_from(self, directory: str | os.PathLike | None, step: int) -> None:
        """The framework resumed from ``directory`` at ``step`` (None: it started afresh): the
        ``job.resumed`` announcement after the first step names the step and the saga whose
        checkpoint it was. Rank 0 says in one line where the job resumed, as :meth:`restore` does."""
        got = framework_restored(directory, step, self.rank)
        if self.rank == 0:
            log.warning("%s", self.restorer.said(got))
        if got is not None:
            self.progress.restored, self.progress.last_committed_step = got, step

    def commit_saved(self, directory: str | os.PathLike, step: int) -> bool:
        """Every rank, after the framework wrote a checkpoint of its own schedule (no request):
        commit it the same way, so a resume may pick it. Returns whether it is committed; a
        failure is logged (there is no request to answer), never raised."""
        try:
            self.frameworks.commit(os.path.abspath(os.fspath(directory)), step, None, None)
        except CheckpointError as exc:
            log.error(
                "rank %d: the %s checkpoint of step %d is not committed: %s", self.rank, self.framework, step, exc
            )
            return False
        self._committed(step, scheduled_copy=True)
        return True

    def finish_due(
        self, directory: str | os.PathLike, error: BaseException | None = None, *, retain: bool = False
    ) -> Saved | None:
        """Every rank, after the framework wrote the due checkpoint into ``directory`` (or failed
        to: ``error``): commit it, ack its requests (``ckpt.failed`` with any rank's reason), then
        pause if a request says so. ``retain``: rank 0 prunes the agent's own layout to ``keep``.
        Never raises a checkpoint failure into the framework's loop; returns what was saved, or None."""
        due = self.frameworks.take() if self.frameworks is not None else None
        if due is None:
            return None
        saved = self.frameworks.finish(due, os.path.abspath(os.fspath(directory)), error)
        if saved is not None:
            self._committed(due.step)
            if retain and self.rank == 0:
                self._retainer.start()
            if due.pause:
                self._pause(due.step, due.requests)
        return saved

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Finish a periodic save in flight, stop the remote copier, deregister (once: a second
        call does nothing)."""
        if self._closed:
            return
        self._closed = True
        if self.frameworks is not None:  # a framework save that never finished: its watchdog goes
            self.frameworks.take()
        log.info(
            "rank %d: %d step agreements over %d step boundaries",
            self.rank,
            self.agreement.agreements,
            self.agreement.boundaries,
        )
        # the last boundary's agreement: a stop (SIGTERM) reaches the ranks at different steps,
        # so never hold the stop up for it
        if not self.agreement.finish(CLOSE_AGREEMENT_WAIT_S):
            log.info("rank %d: the last step agreement was left unfinished (a peer stopped first)", self.rank)
        try:
            self.wait()
            if self.config.check.final and not self._own_layout_has(self.progress.step):
                self.save(self.progress.step)  # the run's last state, compared by `powerguard check-resume`
        finally:
            self.saver.close()
            if self._remote is not None:
                self._remote.close()
            if self._bus is not None:
                self._bus.close()
            self._retainer.join(30)
            if self.nodes is not None and not self.nodes.wait_replicated(60):
                log.warning("rank %d: replication still running at close: the peers' copy may be short", self.rank)
            self.ranks.release(keep_replica=self.nodes is not None and self.nodes.replicating)

    def _own_layout_has(self, step: int) -> bool:
        """A committed checkpoint of ``step`` in the agent's own layout (``<local>/<job>/step-N``),
        where `check-resume` and `try` read the run's last state: a framework's own save of the
        last step (the HF Trainer's ``checkpoint-N`` in its output directory) is not there."""
        return os.path.exists(os.path.join(L.step_dir(self.local_root, self.job, step), L.COMMIT))

    def wait_replicated(self, timeout_s: float | None = None) -> bool:
        """Node scope: wait until the last checkpoint's replication to the peers ended; True when it
        ended (:attr:`replicated` then says whether it was complete)."""
        return self.nodes.wait_replicated(timeout_s) if self.nodes is not None else True

    def __enter__(self) -> CheckpointAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


CheckpointAgent.__doc__ = f"{CheckpointAgent.__doc__}\n\n{inspect.cleandoc(ARGUMENTS_DOC)}"
