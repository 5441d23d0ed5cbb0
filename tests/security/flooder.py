"""A training job's container gone rogue: it publishes junk on the one subject its agent
credential lets it fill (its own rank's ack subject), as fast as the server takes it, from a
process of its own (a job runs on another machine than PowerGuard's services).

    python -m tests.security.flooder --url URL --creds agent-jobA.creds --subject pg.ckpt.jobA.0.ack \
        [--count N] [--size BYTES]

Prints ``flooding`` once connected, ``sent N`` every 5,000 messages and when it stops (after
``--count``, or at SIGTERM); a message the server refuses is counted, not fatal.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import nats


async def flood(url: str, creds: str, subject: str, count: int, size: int) -> int:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    errors: list[BaseException] = []

    async def on_error(exc: BaseException) -> None:
        errors.append(exc)

    nc = await nats.connect(url, user_credentials=creds, error_cb=on_error, max_reconnect_attempts=-1)
    junk = b'{"junk": "' + b"x" * max(0, size - 12) + b'"}'
    print("flooding", flush=True)
    sent = 0
    try:
        while not stop.is_set() and (count <= 0 or sent < count):
            await nc.publish(subject, junk)
            sent += 1
            if sent % 500 == 0:
                await nc.flush()  # the server's pace, not the client buffer's
            if sent % 5000 == 0:
                print(f"sent {sent}", flush=True)
    finally:
        print(f"sent {sent} refused {len(errors)}", flush=True)
        await nc.close()
    return sent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--creds", required=True)
    p.add_argument("--subject", required=True)
    p.add_argument("--count", type=int, default=0, help="stop after this many (0: until SIGTERM)")
    p.add_argument("--size", type=int, default=256, help="bytes per message")
    a = p.parse_args()
    asyncio.run(flood(a.url, a.creds, a.subject, a.count, a.size))


if __name__ == "__main__":
    main()
