"""A training job's container gone rogue: it publishes junk on the one subject its agent
credential lets it fill (its own rank's ack subject), as fast as the server takes it, from a
process of its own (a job runs on another machine than PowerGuard's services).

    python -m tests.security.flooder --url URL --creds agent-jobA.creds --subject pg.ckpt.jobA.0.ack \
        [--subject ANOTHER ...] [--count N] [--size BYTES]

Several ``--subject``: taken in turn (a job spreading its junk over its ranks' subjects, so no
per-subject limit bites). Prints ``flooding`` once connected, ``sent N`` every 5,000 messages
(every 10 of 64 KiB or more) and when it stops (after ``--count``, or at SIGTERM); a message the
server refuses (a payload over the credential's limit closes the connection, which reconnects)
is counted, not fatal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal

import nats


async def flood(url: str, creds: str, subjects: list[str], count: int, size: int, spread: int = 0) -> int:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    errors: list[BaseException] = []

    async def on_error(exc: BaseException) -> None:
        errors.append(exc)

    nc = await nats.connect(
        url, user_credentials=creds, error_cb=on_error, max_reconnect_attempts=-1, reconnect_time_wait=0.1
    )
    junk = b'{"junk": "' + b"x" * max(0, size - 12) + b'"}'
    report, flush_every = (10, 1) if size >= 64 * 1024 else (5000, 500)
    print("flooding", flush=True)
    sent = 0
    try:
        parent = os.getppid()
        while not stop.is_set() and (count <= 0 or sent < count) and os.getppid() == parent:  # ends with its test
            try:
                subject = subjects[sent % len(subjects)]
                await nc.publish(f"{subject}.{sent % spread}" if spread else subject, junk)
                if (sent + 1) % flush_every == 0:
                    await nc.flush(timeout=1)  # the server's pace, not the client buffer's
            except (nats.errors.Error, TimeoutError) as exc:  # refused, or reconnecting: the sender's cost
                errors.append(exc)
                if nc.is_closed:  # the server closed it (a payload over the credential's limit): connect anew
                    with contextlib.suppress(Exception):
                        nc = await nats.connect(url, user_credentials=creds, error_cb=on_error, allow_reconnect=False)
                await asyncio.sleep(0.01)
            sent += 1
            if sent % report == 0:
                print(f"sent {sent}", flush=True)
    finally:
        print(f"sent {sent} refused {len(errors)}", flush=True)
        await nc.close()
    return sent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--creds", required=True)
    p.add_argument("--subject", action="append", required=True, help="subject (repeat: taken in turn)")
    p.add_argument("--count", type=int, default=0, help="stop after this many (0: until SIGTERM)")
    p.add_argument("--size", type=int, default=256, help="bytes per message")
    p.add_argument("--spread", type=int, default=0, help="append .<n % SPREAD> to each subject (keys of a bucket)")
    a = p.parse_args()
    asyncio.run(flood(a.url, a.creds, a.subject, a.count, a.size, a.spread))  # a.subject: the list


if __name__ == "__main__":
    main()
