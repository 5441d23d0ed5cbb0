"""Saga policy: the knobs of the ``coordinator:`` section of the site YAML."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from powerguard.schemas import HoldPolicy


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ckpt_timeout_s: float = Field(default=120.0, gt=0, description="Upper bound of a checkpoint deadline")
    shutdown_reserve_s: float = Field(default=60.0, ge=0, description="Battery runtime kept for the shutdown itself")
    margin_s: float = Field(default=10.0, ge=0, description="Safety margin on the checkpoint deadline")
    max_on_battery_s: float = Field(default=900.0, gt=0, description="Shut down after this long regardless")
    restore_stable_s: float = Field(default=30.0, ge=0, description="On line this long before restoring")
    forget_job_after_s: float = Field(
        default=7 * 24 * 3600.0,
        gt=0,
        description="A job the coordinator knows (its durable book of jobs) and has not heard from for this long "
        "leaves the book: it died without deregistering. Until then an outage asks it for its checkpoint and waits "
        "for it until the deadline, and PowerGuardAgentsMissing fires for it",
    )
    job_silence_s: float = Field(
        default=15.0,
        gt=0,
        description="Power back before any shutdown: a job of the saga not heard from (a rank's heartbeat, every "
        "5 s) this long since is taken to have lost its power (the site went dark before its shutdown) and is "
        "restarted from its newest durable checkpoint; keep it below the agents' 30 s TTL",
    )
    min_restart_charge_pct: float = Field(default=30.0, ge=0, le=100)
    shutdown_timeout_s: float = Field(default=300.0, gt=0, description="Give up waiting for nodes to report off")
    restore_timeout_s: float = Field(default=900.0, gt=0, description="Nodes ready and jobs resumed by then")
    tick_s: float = Field(default=0.25, gt=0, description="How often deadlines are checked")
    lease_ttl_s: float = Field(default=10.0, gt=0, description="Leader lease; a standby takes over after it")
    hold_policy: HoldPolicy = Field(
        default="checkpoint-at-stop",
        description="What jobs do during the hold (a job's registration overrides it): checkpoint-at-stop "
        "(train on, final checkpoint before the shutdown), pause (wait after the power checkpoint until power "
        "returns or the stop), continue (train on; what is trained after the checkpoint is lost at the stop)",
    )
    require_durability: Literal["local", "replicated", "remote"] = Field(
        default="local",
        description="What a rank's checkpoint must survive before the shutdown proceeds: local (its tier's one "
        "copy), replicated (also another node's disk: node-local tier), remote (the remote tier). Bounded by the "
        "battery: at the deadline the shutdown proceeds and the record names the ranks that fell short",
    )
    final_ckpt_factor: float = Field(
        default=2.0,
        ge=1.0,
        description="Decide to stop when the budget left before the shutdown reserve falls to this many times "
        "the measured power checkpoint (so the final checkpoint fits)",
    )
    final_margin_share: float = Field(
        default=0.1,
        ge=0,
        le=0.5,
        description="At the stop, a final checkpoint that does not fit the battery budget (the runtime fell below "
        "what the shutdown needs, e.g. an estimate that jumped) is still taken when final_ckpt_factor times its "
        "cost in this outage fits in this share of the runtime left: the shutdown starts at most that much later, "
        "seconds of its margin spent against the certain loss of the hold's training (0: never)",
    )
    hold_checkpoint_every_s: float = Field(
        default=60.0,
        ge=0,
        description="checkpoint-at-stop jobs: while the saga holds, a checkpoint of every such job this often, so "
        "the training at risk at any moment (a low battery or FSD that leaves no time for the final checkpoint) is "
        "at most this much (0: none)",
    )
    hold_checkpoint_max_share: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description="... but never more often than a job's measured power checkpoint allows: its checkpoints take "
        "at most this share of the hold's time",
    )
    shutdown_factor: float = Field(
        default=1.5,
        ge=1.0,
        description="A node group's measured shutdown (stop decided -> every node off, from earlier real "
        "outages) times this is what the shutdown needs of the battery; until a group has a measurement, "
        "shutdown_reserve_s stands for it",
    )
    ckpt_retries: int = Field(
        default=2,
        ge=0,
        description="A power checkpoint that failed (a rank reported an error) is requested again, as a new "
        "round, up to this many times while the battery budget allows",
    )
    off_retries: int = Field(
        default=1,
        ge=0,
        description="A node whose power-off failed is commanded off again (power-control falls back to its PDU "
        "outlets on a retry) up to this many times while the battery lasts",
    )
    max_event_age_s: float = Field(
        default=120.0,
        gt=0,
        description="Power events older than this (by their time) are ignored: a replayed or delayed history "
        "never starts a saga; a consumer that has to be re-created starts this far back",
    )
    max_clock_skew_s: float = Field(
        default=90.0,
        gt=0,
        description="Events stamped further than this in the future (by the coordinator's clock) are refused by "
        'name (dead letter, powerguard_coordinator_ignored_events_total{reason="future"}): a reading stamped '
        "ahead must never make the real ones look old. Keep it above the worst clock offset between hosts",
    )
    ups_off: bool = Field(
        default=False,
        description="The last step of an outage longer than the battery: once every node a UPS feeds is off and "
        "every job on them has a durable checkpoint, tell the UPS to cut its output after ups_off_delay_s and "
        "turn it on again when mains returns (NUT shutdown.return). Only for a site whose UPSes, PDUs and "
        "BIOS/BMC restore policies bring everything back by themselves (docs/reliability.md)",
    )
    ups_off_delay_s: float = Field(
        default=30.0, ge=0, description="The UPS's delay between the command and its output going off"
    )
    ups_off_runtime_s: float = Field(
        default=60.0,
        ge=0,
        description="Tell a UPS once its runtime left (the most conservative estimate) falls to this plus "
        "ups_off_delay_s, so its output goes off before the battery runs flat",
    )
    ups_off_return_s: float = Field(
        default=60.0,
        ge=0,
        description="After a UPS was told to cut its output, the restore waits this long past the command's "
        "delay (even when mains returned first, a UPS cycles its output: nodes powered on before would lose it)",
    )
    ups_off_after_s: float | None = Field(
        default=600.0,
        gt=0,
        description="Or once the saga has been down on battery this long (a site limit; null: only by runtime)",
    )
    pause_max_s: float = Field(
        default=3600.0, gt=0, description="Paused ranks train on by themselves after this long without a release"
    )
