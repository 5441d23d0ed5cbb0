"""A batch taken from a JetStream pull consumer in one request, received by a subscription
callback.

nats.py's ``PullSubscription.fetch(n)`` waits for each of the n messages with ``next_msg``,
which spends a new task, an ``asyncio.wait_for`` and a ``uuid4`` per message (25.8 µs a message
against 7.2 µs here, ``bench/consumer_path.py``; the coordinator takes 100,000 acks in an
outage). A :class:`BatchPull` sends the same pull request (JetStream's documented
``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`` with ``batch`` and ``no_wait``) and collects
the replies in a core subscription's callback; the messages are nats.py's own ``Msg`` (ack,
metadata and headers as from ``fetch``).

Each request has its own reply subject under the puller's inbox, so a status that ends an
earlier request (404 / 408 / 409) never ends a later one (messages come on their own subjects).
A request whose wait ended before its answer did stays open: no new request is sent until it
is answered in full (or has brought nothing for :data:`GIVE_UP_S`), and what it brings is
handed over first, never dropped (it is delivered and unacknowledged: dropping it would hold
it back until its ack wait expired).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from nats.js import api

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

_HEARTBEAT = api.StatusCode.CONTROL_MESSAGE.value  # "100": an idle heartbeat, not an answer
GIVE_UP_S = 5.0  # an open request that brought nothing for this long is given up
# The most bytes one request may bring (JetStream's pull ``max_bytes``): whatever a batch's
# messages weigh, the server never queues more than this for the connection at once, far below
# its slow-consumer bound (``max_pending``, 64 MiB by default). Without it, 256 messages of 1 MB
# (or 32,768 of 16 KiB) were queued at once and the server closed the coordinator's connection,
# its lease and saga store included, as a slow consumer. At least the largest message (1 MB).
PULL_MAX_BYTES = 4 * 1024 * 1024


def next_subject(stream: str, consumer: str, *, domain: str | None = None) -> str:
    """The subject a pull request for ``consumer`` on ``stream`` is published to."""
    prefix = f"$JS.{domain}.API" if domain else "$JS.API"
    return f"{prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"


class BatchPull:
    """Pull requests for one consumer, one open at a time (:meth:`take` and :meth:`settle` are
    not re-entrant). A request stays open until the server has answered it in full: its ``n``
    messages, or a status (no more messages, expired, the consumer gone); while one is open no
    new one is sent, so messages are handed over in the order the server delivered them."""

    def __init__(self, nc: Client, stream: str, consumer: str, *, domain: str | None = None) -> None:
        self._nc = nc
        self._subject = next_subject(stream, consumer, domain=domain)
        self._inbox = ""
        self._sub: Subscription | None = None
        self._request = 0  # the last request sent
        self._open = 0  # the request still being answered (0: none)
        self._left = 0  # messages the open request may still bring
        self._heard = 0.0  # when the open request was sent or last brought a message (loop time)
        self._got: list[Msg] = []
        self._ended = asyncio.Event()

    async def start(self) -> BatchPull:
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_msg)
        return self

    async def stop(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            await sub.unsubscribe()

    @property
    def open(self) -> bool:
        """Whether a request is still being answered (what it brings comes before anything newer)."""
        return self._open != 0

    def held(self) -> list[Msg]:
        """The messages received and not yet handed over, handed over."""
        got, self._got = self._got, []
        return got

    def _answers_open(self, subject: str) -> bool:
        """A status answers the request whose reply subject it comes on."""
        return self._open != 0 and subject == f"{self._inbox}.{self._open}"

    def _close(self) -> None:
        self._open = 0
        self._ended.set()

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get(api.Header.STATUS) if msg.headers else None
        if status is None:
            # a message comes on its own subject, not the reply subject (only statuses do):
            # with one request open at a time, what arrives meanwhile answers it
            self._got.append(msg)
            if self._open:
                self._heard = asyncio.get_running_loop().time()
                self._left -= 1
                if self._left <= 0:
                    self._close()
        elif status != _HEARTBEAT and self._answers_open(msg.subject):
            self._close()  # no (more) messages, expired, or the server ended the request

    async def _wait(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._ended.wait(), timeout)
        except TimeoutError:
            pass

    async def take(self, n: int, timeout: float, *, max_bytes: int = PULL_MAX_BYTES) -> list[Msg]:
        """Up to ``n`` messages (and at most ``max_bytes``) that are available now, after anything
        received earlier: the request's wait ends when ``n`` arrived, when the server says it has
        no more or that the next would pass ``max_bytes`` (409), or after ``timeout`` s. While an
        earlier request is still open, no new one is sent: this is :meth:`settle`."""
        if self._sub is None:
            raise RuntimeError("BatchPull.take before start")
        if n < 1:
            raise ValueError("take at least one message")
        if self._open:
            return await self.settle(timeout)
        self._request += 1
        self._open, self._left = self._request, n
        self._heard = asyncio.get_running_loop().time()
        self._ended.clear()
        request = json.dumps({"batch": n, "max_bytes": max_bytes, "no_wait": True}).encode()
        await self._nc.publish(self._subject, request, reply=f"{self._inbox}.{self._request}")
        await self._wait(timeout)
        return self.held()

    async def settle(self, timeout: float) -> list[Msg]:
        """What the open request brings within ``timeout`` s (and anything received before). A
        request that brought nothing for :data:`GIVE_UP_S` (its answer lost with a connection)
        is given up: what it delivers later is still handed over, after what came before."""
        if self._open:
            await self._wait(timeout)
            if self._open and asyncio.get_running_loop().time() - self._heard > GIVE_UP_S:
                self._open = 0
        return self.held()
