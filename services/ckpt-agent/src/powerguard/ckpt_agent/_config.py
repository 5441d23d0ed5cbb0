"""The agent's settings, checked once: a wrong value is a ValueError naming the argument,
raised before any process group or thread exists."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import ValidationError

from powerguard.schemas import HOLD_POLICIES, HoldPolicy

from . import _keys as K
from ._check import CheckMode
from ._s3 import RemoteSettings, is_s3

FRAMEWORKS = ("lightning", "hf")

ARGUMENTS_DOC = """Keyword-only arguments:
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
  remote_url: optional remote tier: an fsspec URL (``file:///nas/ckpt``) or ``s3://bucket/prefix``
    (S3's own guarantees: checksums, a create-only COMMIT, multipart uploads; see the README).
  remote_options: the S3 tier's settings (``_s3.RemoteSettings``: endpoint_url, region,
    addressing_style, checksum, concurrency, part_size_mb, profile, secret files; default: env
    ``POWERGUARD_REMOTE_OPTIONS`` as JSON, else boto3's own: ``AWS_ENDPOINT_URL``, ...).
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
    job is stopped; see :meth:`CheckpointAgent.step`.
  pause_poll_s: how often paused ranks check, together, whether they may train on.
  allow_fresh_start: when committed checkpoints of the job exist but none can be restored
    (written by another world size without ``reshard``, corrupt, signed with another key),
    ``restore()`` raises :class:`NoRestorableCheckpoint` naming the newest and why (default);
    True trains from step 0 over them.
  writer_threads: parallel writers (files) per rank of a synchronous save (a power checkpoint);
    None (default): one per 16 MiB of the rank's state, at least 4 and at most 16, and never a
    file under 16 MiB (a state under 64 MiB writes fewer files).
  checksum_key_file: the job's checkpoint key (``powerguard ckpt-key issue --job JOB``) or the
    site's (default: env ``POWERGUARD_CKPT_KEY_FILE``): keyed digests on save; a restore trusts
    only what this job's key signed. A job key lets the job's container sign for that job only.
  allow_rollback: restore this step although the coordinator recorded a newer one as acked by
    every rank (default: env ``POWERGUARD_ALLOW_ROLLBACK``; None: a rollback is refused).
  framework: ``"lightning"`` or ``"hf"``: the framework writes the checkpoints (its callback in
    :mod:`powerguard.ckpt_agent.lightning` / :mod:`powerguard.ckpt_agent.hf` sets this); a
    request agreed at a step becomes :attr:`CheckpointAgent.due`, the framework saves,
    :meth:`CheckpointAgent.finish_due` commits and acks. No periodic saves (the framework keeps
    its own schedule), no remote tier.
"""


@dataclass(frozen=True)
class AgentConfig:
    """The settings of one :class:`CheckpointAgent` (see :data:`ARGUMENTS_DOC`), checked by :meth:`checked`."""

    # the agent's arguments that are settings (the rest are the training's objects and the bus)
    ARGUMENTS: ClassVar[frozenset[str]] = frozenset(
        {
            "job",
            "local_dir",
            "checksum_key_file",
            "pipelined_agreement",
            "remote_url",
            "remote_options",
            "local_every_s",
            "remote_every_s",
            "keep",
            "keep_remote",
            "sync_every_n_steps",
            "agree_every_s",
            "agree_timeout_s",
            "overlap_staging",
            "hold_policy",
            "pause_poll_s",
            "local_scope",
            "replicas",
            "reshard",
            "framework",
            "allow_fresh_start",
            "writer_threads",
            "allow_rollback",
        }
    )

    job: str
    local_root: str
    remote_url: str | None
    local_every_s: float
    remote_every_s: float
    keep: int
    keep_remote: int
    sync_every_n_steps: int
    agree_every_s: float
    agree_timeout_s: float
    overlap_staging: bool
    hold_policy: HoldPolicy | None
    pause_poll_s: float
    local_scope: str
    replicas: int
    reshard: bool
    pipelined: bool
    framework: str | None
    key: K.Keys | None  # the job's checkpoint keys (the file's: a job key, or the site key derived)
    allow_fresh_start: bool = False
    writer_threads: int | None = None
    allow_rollback: int | None = None  # a step the operator named: restored although older than the record
    check: CheckMode = field(default_factory=CheckMode)  # powerguard check-resume's mode (the environment)
    remote_options: RemoteSettings | None = None  # the S3 tier's settings (s3:// remote_url)

    @classmethod
    def checked(
        cls,
        *,
        local_dir: str | os.PathLike,
        checksum_key_file: str | os.PathLike | None,
        pipelined_agreement: bool,
        **kw,
    ) -> AgentConfig:
        framework = kw["framework"]
        if framework is not None:
            if framework not in FRAMEWORKS:
                raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, not {framework!r}")
            if kw["remote_url"] or kw["local_scope"] != "shared":
                raise ValueError(
                    "a framework's checkpoints have the shared local tier only (no remote_url, no node scope)"
                )
            kw["local_every_s"], kw["overlap_staging"] = 0.0, False
        if kw["local_scope"] not in ("shared", "node"):
            raise ValueError(f"local_scope must be 'shared' or 'node', not {kw['local_scope']!r}")
        if kw["replicas"] < 0:
            raise ValueError("replicas must be at least 0")
        if kw["keep"] < 1 or kw["keep_remote"] < 1:
            raise ValueError("keep and keep_remote must be at least 1")
        if kw["sync_every_n_steps"] < 1:
            raise ValueError("sync_every_n_steps must be at least 1")
        if kw["writer_threads"] is not None and kw["writer_threads"] < 1:
            raise ValueError("writer_threads must be at least 1 (None: chosen by the state's size)")
        if kw["agree_every_s"] < 0:
            raise ValueError("agree_every_s must be at least 0")
        if kw["hold_policy"] is not None and kw["hold_policy"] not in HOLD_POLICIES:
            raise ValueError(f"hold_policy must be one of {', '.join(HOLD_POLICIES)}, not {kw['hold_policy']!r}")
        if kw["allow_rollback"] is None and os.environ.get("POWERGUARD_ALLOW_ROLLBACK"):
            text = os.environ["POWERGUARD_ALLOW_ROLLBACK"].strip()
            if not text.isdigit():
                raise ValueError(f"POWERGUARD_ALLOW_ROLLBACK must be a step number, not {text!r}")
            kw["allow_rollback"] = int(text)
        if kw["allow_rollback"] is not None and kw["allow_rollback"] < 0:
            raise ValueError("allow_rollback must be a step number (at least 0)")
        check = CheckMode.from_env()
        if framework is not None and check.stop_at is not None:
            raise ValueError(
                f"powerguard check-resume --stop-at drills plain training loops; a {framework} job's checkpoints "
                "are the framework's own: run `powerguard try -- <command>` (its verdict compares the resumed run "
                "with an uninterrupted one)"
            )
        if check.on:  # under `powerguard check-resume` / `try`: its own directory, no remote tier
            local_dir, kw["remote_url"] = check.directory, None
            kw["job"] = check.job or kw["job"]  # try: the simulated site's name for the job
        kw["remote_options"] = _remote_options(kw["remote_url"], kw.get("remote_options"))
        key_file = checksum_key_file or os.environ.get("POWERGUARD_CKPT_KEY_FILE")
        return cls(
            local_root=os.path.abspath(os.fspath(local_dir)),
            key=K.load_job_keys(key_file, kw["job"]) if key_file else None,
            pipelined=pipelined_agreement,
            check=check,
            **kw,
        )


def _remote_options(url: str | None, given: dict | RemoteSettings | None) -> RemoteSettings | None:
    """The S3 tier's settings: given, or ``POWERGUARD_REMOTE_OPTIONS`` (JSON); a wrong one is a
    ValueError naming the field."""
    if given is None and os.environ.get("POWERGUARD_REMOTE_OPTIONS"):
        if not is_s3(url):
            return None  # the environment's default, for the S3 tier this job does not use
        try:
            given = json.loads(os.environ["POWERGUARD_REMOTE_OPTIONS"])
        except ValueError as exc:
            raise ValueError(f"POWERGUARD_REMOTE_OPTIONS is not JSON: {exc}") from None
    if given is None:
        return RemoteSettings() if is_s3(url) else None
    if not is_s3(url):
        raise ValueError("remote_options are the S3 tier's: give remote_url='s3://bucket/prefix'")
    try:
        return given if isinstance(given, RemoteSettings) else RemoteSettings.model_validate(given)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"remote_options.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
