"""A light simulated node for the fan-out benchmark: one NATS connection that speaks the client
protocol itself (INFO/CONNECT, SUB, PING/PONG, MSG/HMSG in, HPUB out), on an asyncio Protocol.

Why not nats.py here: a nats.py client runs a reading task, a flusher task and a ping timer per
connection; 3,125 of them in one process on a 2-core machine spend most of the fan-out's time
scheduling each other, which measured the simulation rather than PowerGuard. On a site each node
is a leaf nats-server with its own CPU. The server side is unchanged: the real nats-server
cluster, the real subjects, the real JetStream acks (each ack is published with a reply subject
and counts once JetStream's PubAck arrives, as ``js.publish`` would)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

CRLF = b"\r\n"


class NodeConnection(asyncio.Protocol):
    """One node's connection: subscribes to ``subjects`` and calls ``on_msg(payload)`` for each
    message on them; :meth:`publish_acks` sends JetStream publishes and counts their PubAcks."""

    def __init__(self, name: str, subjects: list[str], on_msg: Callable[[bytes], None]) -> None:
        self.name, self.subjects, self.on_msg = name, subjects, on_msg
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.errors: list[str] = []
        self.stored = 0  # PubAcks received
        self._buf = b""
        self._need: tuple[int, int, str] | None = None  # (payload bytes, header bytes, sid) of a message read
        self._acks_done: asyncio.Future[None] | None = None
        self._acks_left = 0
        self._transport: asyncio.Transport | None = None
        self._inbox = f"_INBOX.{name}"

    # ---------------------------------------------------------------- protocol
    def connection_made(self, transport) -> None:
        self._transport = transport

    def connection_lost(self, exc) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"{self.name}: connection lost ({exc})"))
        if self._acks_done is not None and not self._acks_done.done():
            self._acks_done.set_exception(ConnectionError(f"{self.name}: connection lost ({exc})"))

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while True:
            if self._need is not None:
                size, hdr, sid = self._need
                if len(self._buf) < size + 2:
                    return
                body, self._buf = self._buf[hdr:size], self._buf[size + 2 :]
                self._need = None
                self._message(sid, body)
                continue
            end = self._buf.find(CRLF)
            if end < 0:
                return
            line, self._buf = self._buf[:end], self._buf[end + 2 :]
            self._line(line)

    def _line(self, line: bytes) -> None:
        op, _, rest = line.partition(b" ")
        if op == b"MSG":  # MSG <subject> <sid> [reply] <#bytes>
            parts = rest.split()
            self._need = (int(parts[-1]), 0, parts[1].decode())
        elif op == b"HMSG":  # HMSG <subject> <sid> [reply] <#header bytes> <#total bytes>
            parts = rest.split()
            self._need = (int(parts[-1]), int(parts[-2]), parts[1].decode())
        elif op == b"PING":
            self._transport.write(b"PONG\r\n")
        elif op == b"PONG":
            if not self.ready.done():
                self.ready.set_result(None)
        elif op == b"INFO":
            connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True, "protocol": 1}
            out = [b"CONNECT " + json.dumps(connect).encode()]
            out += [f"SUB {s} {i}".encode() for i, s in enumerate(self.subjects, start=1)]
            out += [f"SUB {self._inbox}.* 0".encode(), b"PING", b""]
            self._transport.write(CRLF.join(out))
        elif op == b"-ERR":
            self.errors.append(rest.decode(errors="replace"))

    def _message(self, sid: str, body: bytes) -> None:
        if sid != "0":
            self.on_msg(body)
            return
        if self._acks_done is None:
            return
        if b'"error"' in body:  # a refused publish does not count
            self.errors.append(body.decode(errors="replace"))
        else:
            self.stored += 1
        self._acks_left -= 1
        if self._acks_left == 0 and not self._acks_done.done():
            self._acks_done.set_result(None)

    # ---------------------------------------------------------------- publishing
    async def publish_acks(self, messages: list[tuple[str, str, bytes]], timeout_s: float) -> None:
        """JetStream-publish ``(subject, msg id, payload)`` each with a reply inbox, pipelined,
        and wait for every PubAck (or error)."""
        if not messages:
            return
        self._acks_done = asyncio.get_running_loop().create_future()
        self._acks_left = len(messages)
        out = []
        for n, (subject, msg_id, payload) in enumerate(messages):
            hdr = f"NATS/1.0\r\nNats-Msg-Id: {msg_id}\r\n\r\n".encode()
            out.append(f"HPUB {subject} {self._inbox}.{n} {len(hdr)} {len(hdr) + len(payload)}\r\n".encode())
            out += [hdr, payload, CRLF]
        self._transport.write(b"".join(out))
        await asyncio.wait_for(self._acks_done, timeout_s)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


async def connect_node(url: str, name: str, subjects: list[str], on_msg: Callable[[bytes], None]) -> NodeConnection:
    """Connect, subscribe and wait until the server has the subscriptions (PING answered)."""
    host, _, port = url.removeprefix("nats://").rpartition(":")
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(lambda: NodeConnection(name, subjects, on_msg), host, int(port))
    await asyncio.wait_for(conn.ready, 30)
    return conn
