"""The coordinator's CPU per ack on its real input path, and where it goes: N durable acks
stored in one nats-server's stream (the shipped ``sync_interval: always``), then read back

* by the coordinator's own batch consumer (``Bus.consume_batches``: fetch, decode, the subject
  and clock checks, one ack per message) with a handler that does nothing:
  ``consumer_cpu_us_per_ack``, and the acks one core takes a second at that cost;
* piece by piece on a durable of its own (the same batch): the bulk pull the consumers use
  (``fetch_us``; bus/pull.py), decoding and the subject check (``decode_us``), the JetStream
  metadata of the reply subject (``metadata_us``), the clock check (``stamp_us``), the ack
  (``ack_us``); and nats.py's own ``PullSubscription.fetch`` of the same batch, which the
  consumers used before (``nats_py_fetch_us``).

This process's CPU (``time.process_time``) throughout: the servers' work is not in it. What the
site core and the store add per ack is bench/scale.py's ``ack_cpu_us_per_rank``; the whole
path end to end, with the servers and the nodes' connections on the same cores, is
bench/fanout.py's ``coordinator_follows``.

Writes bench/results/consumer_path.json.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from _provenance import write
from _site import durable_ack

RESULTS = Path(__file__).parent / "results" / "consumer_path.json"
SITE = "bench"


def _acks(n: int) -> list:
    return [durable_ack("job000", r, n, "req", "saga") for r in range(n)]


async def _store(bus, n: int) -> None:
    from powerguard.schemas import encode

    s = bus.names.subjects
    acks = _acks(n)
    for i in range(0, n, 2000):
        await asyncio.gather(
            *(
                bus.js.publish(s.ckpt_ack(e.data.job, e.data.rank), encode(e), headers={"Nats-Msg-Id": e.id})
                for e in acks[i : i + 2000]
            )
        )


async def _consumer(bus, n: int, timeout_s: float) -> float:
    """CPU seconds for the coordinator's batch consumer to take every ack (handler: nothing)."""
    from powerguard.bus.roles import INPUT_BATCH, durable_filters, durable_names
    from powerguard.coordinator.service import JOB_TYPES

    got = 0
    done = asyncio.Event()

    async def handler(items: list) -> None:
        nonlocal got
        got += len(items)
        if got >= n:
            done.set()

    durable = durable_names(SITE)["coordinator-jobs"]
    cpu = time.process_time()
    consumer = await bus.consume_batches(
        *JOB_TYPES,
        batch_handler=handler,
        durable=durable,
        subject=durable_filters(bus.names, SITE)[durable],
        batch=INPUT_BATCH,
    )
    try:
        await asyncio.wait_for(done.wait(), timeout_s)
    except TimeoutError:
        raise SystemExit(f"consumer_path: the consumer took {got:,} of {n:,} acks within {timeout_s:.0f}s") from None
    took = time.process_time() - cpu
    await consumer.stop()
    return took


async def _pieces(bus, n: int, timeout_s: float, *, bulk: bool) -> dict[str, float]:
    """CPU seconds of each step, on a durable that may hold every ack unacked, taken as the
    consumers take a batch (``bulk``: one pull request answered into a callback, bus/pull.py)
    or with nats.py's ``PullSubscription.fetch`` (what they used before)."""
    from nats.js import api

    from powerguard.bus.consumer import check_stamp, decode_on
    from powerguard.bus.pull import BatchPull
    from powerguard.bus.roles import INPUT_BATCH

    spent = dict.fromkeys(("fetch", "decode", "metadata", "stamp", "ack"), 0.0)
    name = "pieces-bulk" if bulk else "pieces-fetch"
    config = api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT, max_ack_pending=n + 1)
    subject = bus.names.subjects.ckpt_ack("*", "*")
    psub = await bus.js.pull_subscribe(subject, durable=name, config=config)
    puller = await BatchPull(bus.nc, await bus.js.find_stream_name_by_subject(subject), name).start()
    deadline = time.monotonic() + timeout_s
    taken = 0
    while taken < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"consumer_path: took {taken:,} of {n:,} acks within {timeout_s:.0f}s ({name})")
        t = time.process_time()
        want = min(INPUT_BATCH, n - taken)
        msgs = await (puller.take(want, timeout=10) if bulk else psub.fetch(want, timeout=10))
        t1 = time.process_time()
        events = [decode_on(bus, m.data, m.subject) for m in msgs]
        t2 = time.process_time()
        for m in msgs:
            _ = m.metadata.sequence.stream
        t3 = time.process_time()
        now = time.time()
        for ev in events:
            check_stamp(ev, now)
        t4 = time.process_time()
        for m in msgs:
            await m.ack()
        t5 = time.process_time()
        for key, took in zip(spent, (t1 - t, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
            spent[key] += took
        taken += len(msgs)
    await puller.stop()
    await psub.unsubscribe()
    return spent


async def run(n: int, timeout_s: float) -> dict:
    from powerguard.bus import Bus, BusNames
    from powerguard.bus.embedded import EmbeddedNats
    from powerguard.coordinator.heap import tune

    tune()  # the collector's thresholds the coordinator's process runs with
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNats(store_dir=tmp)  # sync_interval: always (shipped)
        server.start()
        try:
            bus = await Bus.connect([server.url], service="coordinator", names=BusNames.isolated())
            try:
                await _store(bus, n)
                consumer_s = await _consumer(bus, n, timeout_s)
                pieces = await _pieces(bus, n, timeout_s, bulk=True)
                nats_py = await _pieces(bus, n, timeout_s, bulk=False)
            finally:
                await bus.close()
        finally:
            server.stop()
    per = {f"{k}_us": round(v / n * 1e6, 1) for k, v in pieces.items()}
    consumer_us = consumer_s / n * 1e6
    return {
        "benchmark": "consumer_path",
        "messages": n,
        "consumer_cpu_us_per_ack": round(consumer_us, 1),
        "acks_per_s_one_core": round(1e6 / consumer_us),
        **per,
        "pieces_sum_us": round(sum(per.values()), 1),
        "nats_py_fetch_us": round(nats_py["fetch"] / n * 1e6, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--acks", type=int, default=50000, help="acks stored and read back (default: 50000)")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="bound on each read-back (default: 300)")
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default: {RESULTS})")
    args = ap.parse_args()
    result = asyncio.run(run(args.acks, args.timeout_s))
    print(result)
    write(result, args.out)


if __name__ == "__main__":
    main()
