"""Shared fixtures: a real nats-server for the whole session, isolated stream/KV names per
test, and an in-memory OpenTelemetry exporter."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from powerguard.bus import Bus, BusNames, EmbeddedNats

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_binary(name: str, package: str) -> str:
    """Path of a peer's binary; skip (locally) or fail (CI) when its package is missing."""
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None)
    if path:
        return path
    message = f"{name} not found: apt-get install {package}"
    if IN_CI:
        pytest.fail(message + " (CI must install every peer)")
    pytest.skip(message)


def require_module(name: str, extra: str) -> None:
    """Import check for an optional dependency; skip (locally) or fail (CI, which installs the
    extras: ``make venv``) when it is missing."""
    try:
        __import__(name)
    except ImportError as exc:
        message = f"{name} not importable ({exc}): pip install 'powerguard-ckpt-agent[{extra}]'"
        if IN_CI:
            pytest.fail(message + " (CI must install every extra)", pytrace=False)
        pytest.skip(message, allow_module_level=True)


WATCHDOG_GRACE_S = float(os.environ.get("POWERGUARD_TEST_WATCHDOG_GRACE_S", "120"))  # past a test's timeout


FULL = os.environ.get("PG_FULL") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.full(reason=...)``: skipped unless PG_FULL=1 (``make test-full``), the
    reason saying which CI test covers the same path (CI's time on a 2-core machine)."""
    if FULL:
        return
    for item in items:
        if mark := item.get_closest_marker("full"):
            item.add_marker(pytest.mark.skip(reason=f"PG_FULL=1 runs it ({mark.kwargs.get('reason', '')})"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A test still running WATCHDOG_GRACE_S after its timeout ends the session with every
    thread's stack. pytest-timeout interrupts a test once; a teardown that hangs after that (an
    event loop joining a stuck thread) would otherwise run until CI's own limit, silently."""
    marker = item.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout") or 300)

    def fire() -> None:
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:  # write to the real stderr, not the test's captured one
            with contextlib.suppress(Exception):
                capture.suspend_global_capture(in_=True)
        sys.stderr.write(f"\n\nWATCHDOG: {item.nodeid} still running {limit + WATCHDOG_GRACE_S:.0f}s after it began;\n")
        sys.stderr.write("every thread's stack follows, then the session ends (exit 70)\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(70)

    timer = threading.Timer(limit + WATCHDOG_GRACE_S, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


_EXPORTER = InMemorySpanExporter()
from powerguard.bus.tracing import PresetIdGenerator  # noqa: E402

trace.set_tracer_provider(TracerProvider(id_generator=PresetIdGenerator()))
trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def spans() -> InMemorySpanExporter:
    _EXPORTER.clear()
    return _EXPORTER


@pytest.fixture(scope="session", autouse=True)
def reference_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The drills of this run share their uninterrupted reference training (SimSite.reference_run):
    same command line, same code, same result; trained once (about 24 s a drill here)."""
    path = tmp_path_factory.mktemp("reference-cache")
    os.environ.setdefault("POWERGUARD_REFERENCE_CACHE", str(path))
    return Path(os.environ["POWERGUARD_REFERENCE_CACHE"])


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> EmbeddedNats:
    server = EmbeddedNats(store_dir=tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def names() -> BusNames:
    return BusNames.isolated()


@pytest.fixture
async def make_bus(nats_server: EmbeddedNats, names: BusNames) -> AsyncIterator[Callable[..., Awaitable[Bus]]]:
    """Factory: ``await make_bus("service")`` connects a bus on this test's isolated names."""
    buses: list[Bus] = []

    async def make(service: str = "test", **kwargs) -> Bus:
        bus = await Bus.connect(nats_server.url, service=service, names=kwargs.pop("names", names), **kwargs)
        buses.append(bus)
        return bus

    yield make
    if buses:
        admin = buses[0]
        for bus in reversed(buses[1:]):
            await bus.close()
        if admin.nc.is_connected:
            for name in (
                *names.streams,
                f"KV_{names.sagas}",
                f"KV_{names.agents}",
                f"KV_{names.leases}",
                f"KV_{names.ups}",
                f"KV_{names.power}",
            ):
                try:
                    await admin.js.delete_stream(name)
                except Exception:
                    pass
        await admin.close()


@pytest.fixture
async def bus(make_bus: Callable[..., Awaitable[Bus]]) -> Bus:
    return await make_bus("test")
