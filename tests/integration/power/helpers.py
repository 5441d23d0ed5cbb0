"""Site files and an event recorder for the power-control service tests."""

from __future__ import annotations

from typing import Any

from powerguard.bus import Bus
from powerguard.power_control.config import PowerControlSettings
from powerguard.power_control.service import PowerControl
from powerguard.schemas import (
    Envelope,
    JobRestarted,
    JobStopped,
    NodeState,
    PowerActionDone,
    PowerActionFailed,
    PowerCommandData,
    PowerOnRequested,
    ShutdownRequested,
    SiteConfig,
    UpsOutputResult,
)
from tests.waiting import eventually

from .peers import PASSWORD, USER

FAST = dict(
    soft_off_timeout_s=3.0,
    boot_timeout_s=20.0,
    poll_interval_s=0.1,
    gather_s=0.3,
    retries=1,
    retry_backoff_s=0.2,
    device_timeout_s=5.0,
    outlet_stagger_s=0.0,
)


def creds(monkeypatch) -> dict[str, Any]:
    monkeypatch.setenv("PG_TEST_BMC_USER", USER)
    monkeypatch.setenv("PG_TEST_BMC_PASSWORD", PASSWORD)
    monkeypatch.setenv("PG_TEST_BMC_BAD", "not-the-password")
    monkeypatch.setenv("PG_TEST_PDU_RW", "private")  # the test snmpd's write community
    return {"username": {"env": "PG_TEST_BMC_USER"}, "password": {"env": "PG_TEST_BMC_PASSWORD"}}


def site(nodes: list[dict], *, pdus: list[dict] | None = None, **settings: Any) -> SiteConfig:
    return SiteConfig.model_validate(
        {
            "site": "dc1",
            "ups": [{"name": "ups-a", "driver": "nut"}],
            "pdus": pdus or [],
            "nodes": [{"feeds": ["ups-a"], **n} for n in nodes],
            "power_control": {**FAST, **settings},
        }
    )


class Recorder:
    """Every power result, node state and job event, in arrival order."""

    def __init__(self) -> None:
        self.events: list[Envelope] = []

    async def start(self, bus: Bus) -> Recorder:
        s = bus.subjects

        async def handler(event: Envelope) -> None:
            self.events.append(event)

        await bus.consume(
            PowerActionDone,
            PowerActionFailed,
            NodeState,
            JobStopped,
            JobRestarted,
            UpsOutputResult,
            handler=handler,
            durable="recorder",
            subject=[s.power_result("*"), s.job_result("*"), s.ups_result("*")],
            deliver="new",
        )
        return self

    def of(self, kind: type[Envelope], **match: Any) -> list[Envelope]:
        return [
            e for e in self.events if isinstance(e, kind) and all(getattr(e.data, k) == v for k, v in match.items())
        ]

    def states(self, node: str) -> list[str]:
        return [e.data.state for e in self.of(NodeState, node=node)]

    async def wait(self, pred, timeout: float = 30.0, what: str = "") -> None:
        def summary() -> str:
            return str(
                [
                    (
                        type(e).__name__,
                        getattr(e.data, "node", None) or getattr(e.data, "job", None) or getattr(e.data, "ups", None),
                        getattr(e.data, "action", getattr(e.data, "state", "")),
                        getattr(e.data, "error", None),
                    )
                    for e in self.events
                ]
            )

        await eventually(pred, timeout, what or "the events", details=summary)


def shutdown(node: str, saga: str = "saga-1", **kw: Any) -> ShutdownRequested:
    return ShutdownRequested(
        data=PowerCommandData(saga_id=saga, node=node, idempotency_key=f"{saga}/{node}/shutdown", **kw)
    )


def power_on(node: str, saga: str = "saga-1", **kw: Any) -> PowerOnRequested:
    return PowerOnRequested(
        data=PowerCommandData(saga_id=saga, node=node, idempotency_key=f"{saga}/{node}/power_on", **kw)
    )


async def announce_saga(bus: Bus, saga_id: str = "saga-1", state: str = "shutting_down") -> None:
    """The coordinator's part: power-control executes commands only of sagas it announced
    (their newest ``saga.state_changed``), in a state that allows them."""
    from powerguard.schemas import SagaData, SagaStateChanged

    await bus.publish(SagaStateChanged(data=SagaData(saga_id=saga_id, site="dc1", state=state)))


async def announced(bus: Bus, saga_id: str) -> bool:
    return await bus.last(bus.subjects.saga(saga_id)) is not None


async def service(bus: Bus, site_cfg: SiteConfig, sagas: tuple[str, ...] = ("saga-1",)) -> PowerControl:
    for saga_id in sagas:
        if not await announced(bus, saga_id):
            await announce_saga(bus, saga_id)
    pc = PowerControl(bus, site_cfg, PowerControlSettings.model_validate(site_cfg.section("power_control")))
    await pc.start()
    return pc


def job_cmd(kind, job: str, nodes: list[str], saga: str = "saga-1"):
    """JobStopRequested / JobRestartRequested as the coordinator sends them."""
    from powerguard.schemas import JobData

    action = "restart" if kind.__name__ == "JobRestartRequested" else "stop"
    return kind(data=JobData(job=job, saga_id=saga, nodes=nodes, idempotency_key=f"{saga}/{job}/{action}"))
