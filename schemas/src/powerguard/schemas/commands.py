"""Power commands (``pg.cmd.power.<node>``) and results (``pg.result.power.<node>``); a UPS's
output commands (``pg.cmd.ups.<ups>``) and their results (``pg.result.ups.<ups>``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .envelope import Data, Envelope
from .subjects import Subjects


def command_key(saga_id: str, target: str, action: str) -> str:
    """The idempotency key of a saga's command: ``<saga>/<node or job>/<action>`` (a job's stop
    is ``<saga>/<job>/stop``). Receivers deduplicate on it; power-control looks one up to wait
    for a job's own stop before it powers the job's node off."""
    return f"{saga_id}/{target}/{action}"


PowerAction = Literal["status", "on", "soft_off", "off", "cycle", "outlet_on", "outlet_off", "job_stop", "job_start"]
NodePowerState = Literal["on", "off", "shutting_down", "booting", "ready", "unknown"]


class PowerCommandData(Data):
    saga_id: str
    node: str
    idempotency_key: str = Field(description="<saga>/<node>/<action>; a repeat does nothing new")
    reason: str | None = None
    jobs: list[str] = Field(default_factory=list, max_length=10_000, description="Jobs on the node to stop first")
    dry_run: bool = False
    retry: int = Field(
        default=0,
        ge=0,
        description="A shutdown commanded again after its off failed: power-control falls back to the node's "
        "PDU outlets when the BMC fails again",
    )


class PowerCommand(Envelope):
    data: PowerCommandData
    SUBJECT_TEMPLATE = "{prefix}.cmd.power.{node}"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.power_cmd(self.data.node)


class ShutdownRequested(PowerCommand):
    """Stop the node's jobs, soft-off, hard-off after a timeout, optionally outlets off."""

    type: Literal["io.powerguard.power.v1.shutdown_requested"] = "io.powerguard.power.v1.shutdown_requested"


class PowerOnRequested(PowerCommand):
    """Outlets on (staggered), BMC power-on (batched), wait until ready."""

    type: Literal["io.powerguard.power.v1.on_requested"] = "io.powerguard.power.v1.on_requested"


class PowerResultData(Data):
    saga_id: str | None = None
    node: str
    action: PowerAction
    idempotency_key: str | None = None
    device: str | None = Field(default=None, description="bmc:<name>, pdu:<name>:<outlet>, ...")
    power_state: NodePowerState | None = None
    detail: str | None = None
    error: str | None = None
    duration_s: float | None = Field(default=None, ge=0)
    dry_run: bool = False


class PowerResult(Envelope):
    data: PowerResultData
    SUBJECT_TEMPLATE = "{prefix}.result.power.{node}"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.power_result(self.data.node)


class PowerActionDone(PowerResult):
    type: Literal["io.powerguard.power.v1.action_done"] = "io.powerguard.power.v1.action_done"


class PowerActionFailed(PowerResult):
    type: Literal["io.powerguard.power.v1.action_failed"] = "io.powerguard.power.v1.action_failed"


class NodeStateData(Data):
    node: str
    state: NodePowerState
    saga_id: str | None = None
    detail: str | None = None


class NodeState(Envelope):
    """A node's power/readiness state as power-control sees it."""

    type: Literal["io.powerguard.node.v1.state"] = "io.powerguard.node.v1.state"
    data: NodeStateData
    SUBJECT_TEMPLATE = "{prefix}.result.power.{node}"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.power_result(self.data.node)


class UpsOutputCommandData(Data):
    saga_id: str
    ups: str
    idempotency_key: str = Field(description="<saga>/ups:<ups>/output_off; a repeat does nothing new")
    delay_s: float = Field(ge=0, description="The UPS turns its output off this long after the command")
    reason: str | None = None
    nodes: list[str] = Field(
        default_factory=list,
        max_length=100_000,
        description="The nodes that lose power with it: power-control reads each one's power first and refuses "
        "the command while one is on (powered on by hand since its off)",
    )
    dry_run: bool = False


class UpsOutputOffRequested(Envelope):
    """The last step of an outage longer than the battery: the UPS turns its output off after
    ``delay_s`` and on again when mains returns (NUT ``shutdown.return``)."""

    type: Literal["io.powerguard.ups.v1.output_off_requested"] = "io.powerguard.ups.v1.output_off_requested"
    data: UpsOutputCommandData
    SUBJECT_TEMPLATE = "{prefix}.cmd.ups.{ups}"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.ups_cmd(self.data.ups)


class UpsOutputResultData(Data):
    saga_id: str | None = None
    ups: str
    idempotency_key: str | None = None
    ok: bool
    detail: str | None = None
    error: str | None = None
    device: str | None = Field(default=None, description="ups:<name>")
    duration_s: float | None = Field(default=None, ge=0)
    dry_run: bool = False


class UpsOutputResult(Envelope):
    """What the UPS said to an output command (its own result where the protocol tracks it)."""

    type: Literal["io.powerguard.ups.v1.output_result"] = "io.powerguard.ups.v1.output_result"
    data: UpsOutputResultData
    SUBJECT_TEMPLATE = "{prefix}.result.ups.{ups}"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.ups_result(self.data.ups)
