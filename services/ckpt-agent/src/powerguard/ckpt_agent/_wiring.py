"""The agent's collaborators, built from its checked settings in the one order every rank
follows (process groups are collective: each rank makes them in the same order). Returns
them (:class:`Parts`); the agent keeps them and calls them, never the other way round."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from typing import Any

from powerguard.bus import BusNames
from powerguard.schemas import AgentData

from . import _layout as L
from ._acks import Acks
from ._agreement import StepAgreement
from ._bus import BusThread
from ._config import AgentConfig
from ._framework import FrameworkSaves
from ._hold import Hold
from ._node_tier import NodeTier, node_place
from ._nodes import Topology
from ._progress import Progress
from ._quiet import Quiet
from ._ranks import Ranks
from ._remote import RemoteCopier
from ._restore import Restorer
from ._retainer import Retainer
from ._s3 import S3Store, is_s3
from ._saver import Saver
from ._state import TrainingState
from ._tiers import SharedTier
from ._writers import reader_threads


@dataclass(frozen=True)
class TrainingParts:
    """What the training passed in to be checkpointed."""

    model: Any
    optimizer: Any
    scheduler: Any
    extra_state: dict[str, Any] | None
    rank_state: dict[str, Any] | None


@dataclass(frozen=True)
class BusOptions:
    url: str | None
    creds: str | os.PathLike | None
    names: BusNames | None
    heartbeat_s: float
    http_port: int | None


@dataclass(frozen=True)
class Parts:
    node: str
    local_root: str  # this rank's local tier root (try: each simulated node's own)
    ranks: Ranks
    state: TrainingState
    retainer: Retainer
    nodes: NodeTier | None
    saver: Saver
    agreement: StepAgreement
    restorer: Restorer
    bus: BusThread | None
    http: Any
    acks: Acks
    hold: Hold
    frameworks: FrameworkSaves | None
    remote: RemoteCopier | None
    quiet: Quiet
    progress: Progress  # written by the agent alone; the bus thread heartbeats what it says


def wire(cfg: AgentConfig, training: TrainingParts, *, node: str | None, bus: BusOptions) -> Parts:
    if cfg.check.on:  # a resume check runs without a coordinator; `try`, on the simulated site's bus
        bus = BusOptions(cfg.check.nats_url, None, None, bus.heartbeat_s, bus.http_port if cfg.check.nats_url else None)
    if bus.http_port is not None and not bus.url:  # the trigger publishes a request on the bus
        raise ValueError(
            "http_port needs nats_url: POST /api/v1/trigger_checkpoint asks the coordinator's bus for a "
            "checkpoint (without a bus, call guard.save(step) from the training loop instead)"
        )
    node = cfg.check.node() or node or socket.gethostname().split(".")[0]
    cfg = replace(cfg, local_root=cfg.check.root(cfg.local_root, node=node, node_scope=cfg.local_scope == "node"))
    ranks = Ranks(replication=cfg.local_scope == "node")
    t = training
    state = TrainingState(
        model=t.model,
        optimizer=t.optimizer,
        scheduler=t.scheduler,
        extra_state=t.extra_state,
        rank_state=t.rank_state,
        rank=ranks.rank,
    )
    fs, _ = L.fs_for(cfg.local_root)
    signing = cfg.key.job if cfg.key is not None else None  # the job's own key signs its checkpoints
    retainer = Retainer(fs, cfg.local_root, cfg.job, cfg.keep)
    topo = Topology(tuple(ranks.gather(node)))  # which node each rank is on
    progress = Progress()
    thread, http = (
        connect(cfg, bus, node=node, rank=ranks.rank, world_size=ranks.world_size, progress=progress)
        if bus.url
        else (None, None)
    )
    acks = Acks(thread, job=cfg.job, rank=ranks.rank, world_size=ranks.world_size, local_root=cfg.local_root, fs=fs)
    nodes = None
    if cfg.local_scope == "node":
        nodes = NodeTier.build(
            node_place(ranks, topo, node, state),
            fs,
            job=cfg.job,
            root=cfg.local_root,
            keys=cfg.key,
            replicas=cfg.replicas,
            reshard=cfg.reshard,
            retainer=retainer,
            on_replicated=acks.replicated,
            readers=reader_threads(_local_ranks()),
            gather=bool(cfg.remote_url),
        )
    tier = nodes
    if tier is None:
        tier = SharedTier(ranks, fs, job=cfg.job, key=signing, retainer=retainer, root=cfg.local_root, node=node)
        tier.prove()  # every rank reads rank 0's nonce back: a tier that is not shared is refused here
    saver = Saver(
        ranks,
        state,
        tier,
        job=cfg.job,
        root=cfg.local_root,
        fs=fs,
        key=signing,
        every_s=cfg.local_every_s,
        overlap=cfg.overlap_staging and t.optimizer is not None,
        node=node,
        writers=cfg.writer_threads,
        readers=reader_threads(_local_ranks()),  # a committed step read back before its ack
    )
    agreement = StepAgreement(
        ranks,
        pipelined=cfg.pipelined,
        sync_every_n_steps=cfg.sync_every_n_steps,
        agree_every_s=cfg.agree_every_s,
        agree_timeout_s=cfg.agree_timeout_s,
    )
    s3 = S3Store(cfg.remote_url, cfg.remote_options) if is_s3(cfg.remote_url) else None
    restorer = Restorer(
        ranks,
        state,
        job=cfg.job,
        root=cfg.local_root,
        fs=fs,
        remote_url=cfg.remote_url,
        s3=s3,
        node=node,
        keys=cfg.key,
        reshard=cfg.reshard,
        nodes=nodes,
        allow_fresh_start=cfg.allow_fresh_start,
        readers=reader_threads(_local_ranks()),  # files each rank verifies and loads at once
    )
    frameworks = (
        FrameworkSaves(ranks, acks, job=cfg.job, framework=cfg.framework, key=signing) if cfg.framework else None
    )
    remote = None
    if cfg.remote_url and ranks.rank == 0:
        remote = RemoteCopier(
            cfg.local_root,
            cfg.remote_url,
            job=cfg.job,
            keep=cfg.keep_remote,
            every_s=cfg.remote_every_s,
            key=signing,
            on_copied=acks.remote_copied,
            s3=s3,
            replicated=nodes.wait_replicated if nodes is not None else None,
        )
    hold = Hold(thread, ranks, poll_s=cfg.pause_poll_s)
    quiet = Quiet(ranks, thread, poll_s=cfg.pause_poll_s, timeout_s=cfg.agree_timeout_s)
    return Parts(
        node,
        cfg.local_root,
        ranks,
        state,
        retainer,
        nodes,
        saver,
        agreement,
        restorer,
        thread,
        http,
        acks,
        hold,
        frameworks,
        remote,
        quiet,
        progress,
    )


def connect(
    cfg: AgentConfig, opts: BusOptions, *, node: str, rank: int, world_size: int, progress: Progress
) -> tuple[BusThread, Any]:
    """The rank's bus thread, started (and rank 0's HTTP trigger, kept alive by the caller)."""
    from powerguard.bus.env import auth_options
    from powerguard.bus.tracing import configure_tracing

    configure_tracing("powerguard-ckpt-agent")  # exports only when OTEL_* env asks for it
    from powerguard.bus.creds import expiry_of

    auth = auth_options()
    if opts.creds is not None:
        auth["creds_file"] = os.fspath(opts.creds)
    agent = AgentData(
        job=cfg.job,
        rank=rank,
        world_size=world_size,
        node=node,
        tiers=["local", "remote"] if cfg.remote_url else ["local"],
        hold_policy=cfg.hold_policy,
        credential_expires=expiry_of(auth.get("creds_file")),
    )
    bus = BusThread(
        url=opts.url,
        names=opts.names or BusNames(),
        agent=agent,
        progress=progress,
        heartbeat_s=opts.heartbeat_s,
        auth=auth,
    )
    bus.start()
    http = None
    if opts.http_port is not None and rank == 0:
        from ._http import serve_trigger

        http = bus.run(serve_trigger(bus, port=opts.http_port))
    return bus, http


def _local_ranks() -> int:
    """Ranks on this node (torchrun's ``LOCAL_WORLD_SIZE``; 1 when it is not set or not a number)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1
