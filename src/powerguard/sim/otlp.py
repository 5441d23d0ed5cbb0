"""A minimal OTLP/HTTP trace receiver for the demo: every process of the drill (services,
training ranks) exports its spans here with the standard OTLP exporter
(``OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:<port>``), and the demo writes them out as
OTLP JSON, draws the timeline, and forwards the raw requests to a real collector when the
user set ``OTEL_EXPORTER_OTLP_ENDPOINT`` themselves."""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    service: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: bool

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else str(v)


class OtlpReceiver:
    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.spans: list[Span] = []
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except ConnectionError:  # the exporter hung up mid-request (its service stopping): nothing to keep
            return web.Response(status=400, text="the request was cut off")
        if request.content_type != "application/x-protobuf":
            return web.Response(status=415, text="send OTLP protobuf (application/x-protobuf)")
        msg = ExportTraceServiceRequest()
        try:
            msg.ParseFromString(body)
        except Exception as exc:
            return web.Response(status=400, text=f"not an ExportTraceServiceRequest: {exc}")
        self.requests.append(body)
        self._ingest(msg)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    def _ingest(self, msg: ExportTraceServiceRequest) -> None:
        for rs in msg.resource_spans:
            service = next((_value(a.value) for a in rs.resource.attributes if a.key == "service.name"), "?")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(
                        Span(
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex() or None,
                            name=s.name,
                            service=str(service),
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            error=s.status.code == 2,
                        )
                    )

    def trace(self, trace_id: str) -> list[Span]:
        return sorted((s for s in self.spans if s.trace_id == trace_id), key=lambda s: s.start_ns)

    def write_otlp_json(self, path: Path, trace_id: str | None = None) -> int:
        """The received spans (of one trace, or all) in the OTLP JSON encoding (hex ids)."""
        resource_spans = []
        for body in self.requests:
            msg = ExportTraceServiceRequest()
            msg.ParseFromString(body)
            for rs in MessageToDict(msg).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    spans = []
                    for s in ss.get("spans", []):
                        for key in ("traceId", "spanId", "parentSpanId"):
                            if s.get(key):
                                s[key] = base64.b64decode(s[key]).hex()
                        if trace_id is None or s.get("traceId") == trace_id:
                            spans.append(s)
                    ss["spans"] = spans
                rs["scopeSpans"] = [ss for ss in rs.get("scopeSpans", []) if ss["spans"]]
                if rs["scopeSpans"]:
                    resource_spans.append(rs)
        path.write_text(json.dumps({"resourceSpans": resource_spans}, indent=1))
        return sum(len(ss["spans"]) for rs in resource_spans for ss in rs["scopeSpans"])

    async def forward(self, endpoint: str) -> int:
        """POST every received request, unchanged, to another OTLP/HTTP endpoint."""
        url = endpoint.rstrip("/") + ("" if endpoint.rstrip("/").endswith("/v1/traces") else "/v1/traces")
        sent = 0
        async with ClientSession(timeout=ClientTimeout(total=10)) as http:
            for body in self.requests:
                try:
                    async with http.post(url, data=body, headers={"Content-Type": "application/x-protobuf"}) as rsp:
                        sent += rsp.status < 300
                except Exception as exc:
                    log.warning("could not forward spans to %s: %s", url, exc)
                    break
        return sent


def main(argv: list[str] | None = None) -> int:
    """``python -m powerguard.sim.otlp --port 4318``: a trace sink for drills (compose ``sim``
    profile): OTLP/HTTP in, ``GET /spans`` out (JSON: trace id, span id, parent, name, service)."""
    import argparse
    import asyncio
    import signal

    p = argparse.ArgumentParser(prog="python -m powerguard.sim.otlp", description=main.__doc__.split("\n\n")[0])
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=4318)
    args = p.parse_args(argv)

    async def serve() -> None:
        receiver = OtlpReceiver()

        async def spans(_: web.Request) -> web.Response:
            return web.json_response(
                [
                    {
                        "trace_id": s.trace_id,
                        "span_id": s.span_id,
                        "parent_id": s.parent_id,
                        "name": s.name,
                        "service": s.service,
                        "attributes": {k: str(v) for k, v in s.attributes.items()},
                    }
                    for s in receiver.spans
                ]
            )

        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post("/v1/traces", receiver._traces)
        app.router.add_get("/spans", spans)
        app.router.add_get("/healthz", lambda _: web.Response(text="ok"))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port).start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        print(f"trace sink on {args.host}:{args.port}", flush=True)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
