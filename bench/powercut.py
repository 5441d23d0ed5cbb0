"""Power-cut campaigns on the power-cut filesystem (tests/powercut): a job saving checkpoints
loses power at random instants and restores in a fresh process (``--cuts``; ``--remote-cuts``:
with its remote tier, restored from it alone), and a real
nats-server with PowerGuard's broker settings loses power after acknowledging messages
(``--broker-cuts``), the S3 tier's uploader killed at a random moment of its copy to a real S3
server (``--s3-cuts``: tests/powercut/s3_campaign.py), and the broker with the coordinator and
power-control as processes loses power at a random moment of an outage (``--service-cuts``:
tests/powercut/services_campaign.py), and the same with a 3-node cluster, every server's store
cut at once (``--cluster-cuts``).
Prints each violation; writes bench/results/powercut.json with the counts (``checkpoint_cuts``,
``broker_cuts``, ``service_cuts``, ``cluster_cuts``, ``violations``), each kind's violations and
seconds, and what each kind checked.

    python bench/powercut.py --cuts 200 --remote-cuts 50 --broker-cuts 50 --service-cuts 50 --cluster-cuts 20
    python bench/powercut.py --merge --cuts 0 --remote-cuts 0 --broker-cuts 0 --service-cuts 0 --cluster-cuts 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "powercut.json"
SERVICE_CUTS_CHECKED = (
    "one nats-server (sync_interval always, journal-mode file system), the coordinator and power-control as "
    "processes, two nodes behind simulated IPMI BMCs; everything loses power at once at a random state of an outage "
    "(holding, shutting_down, down, restoring, + up to 0.4 s), restarts: the saga is still there and ends done, "
    "every node powered off once and on once by its BMC's own count"
)
CLUSTER_CUTS_CHECKED = (
    "the same with a 3-node JetStream cluster (R3 stream and buckets), each server's store on its own "
    "journal-mode power-cut file system, all three cut at the same instant"
)

from tests.powercut import PowerCutFs, unavailable  # noqa: E402
from tests.powercut.campaign import checkpoint_cut  # noqa: E402
from tests.powercut.services_campaign import services_cut  # noqa: E402


async def broker_cut(root: Path, seed: int) -> list[str]:
    """Publish a random number of acknowledged messages to a file stream, cut, restart: every
    acknowledged message is there (journal mode: the broker does not fsync its directories)."""
    import nats
    from nats.js import api

    from powerguard.bus import EmbeddedNats

    rng = random.Random(seed)
    n = rng.randint(1, 300)
    pc = PowerCutFs(root / f"broker-{seed}", mode="journal").start()
    server = EmbeddedNats(store_dir=pc.mountpoint / "nats").start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s.>"], storage=api.StorageType.FILE)
        acked = [(await js.publish(f"s.{i % 7}", f"m{i}".encode())).seq for i in range(n)]
        server.kill()
        await nc.close()
        pc.cut()
        pc.start()
        server = EmbeddedNats(port=server.port, store_dir=server.store_dir).start()
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        info = await js.stream_info("S")
        stored = info.state.messages
        await nc.close()
        return (
            [] if stored >= len(acked) else [f"broker seed {seed}: {len(acked)} acknowledged, {stored} after the cut"]
        )
    except Exception as exc:  # the stream gone, the server not starting: a violation
        return [f"broker seed {seed}: {type(exc).__name__}: {exc}"]
    finally:
        server.kill()
        pc.stop()


CHECKED = {
    "checkpoint_cuts": "one rank saving every step (ckpt-agent, local tier, retention keep=2) on the POSIX "
    "power-cut filesystem, cut at uniform(0.2, 2.5) s after the first ack; restore in a fresh process: no "
    "exception, restored >= newest acked step, <= the one in flight, bit-exact weights",
    "remote_cuts": "the same job with a remote tier (file://, on the same power-cut file system: its host loses "
    "power too), every committed checkpoint copied there; after the cut the node is gone and the restore reads the "
    "remote tier alone: no exception, restored >= the newest copy reported committed remotely, bit-exact",
    "broker_cuts": "one nats-server (sync_interval always, journal-mode file system) acknowledging 1-300 "
    "messages, cut, restarted: every acknowledged message stored",
    "service_cuts": SERVICE_CUTS_CHECKED,
    "cluster_cuts": CLUSTER_CUTS_CHECKED,
    "s3_cuts": "the S3 tier's uploader (a process copying a committed ~12 MiB checkpoint to a real S3 server, "
    "SeaweedFS, in 5 MiB parts over a link of uneven speed) killed at uniform(0, 0.45) s into its copy (which "
    "takes ~0.2-0.4 s): a copy reported done is committed; a committed step is whole (read back and verified "
    "against its manifests); the next start leaves no incomplete upload",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cuts", type=int, default=200, help="checkpoint cuts")
    p.add_argument("--remote-cuts", type=int, default=50, help="checkpoint cuts restored from the remote tier")
    p.add_argument("--broker-cuts", type=int, default=50)
    p.add_argument("--s3-cuts", type=int, default=100, help="the S3 tier's uploader killed mid-copy (SeaweedFS)")
    p.add_argument("--service-cuts", type=int, default=50, help="cuts of the broker and the services mid-outage")
    p.add_argument(
        "--cluster-cuts",
        type=int,
        default=20,
        help="the same with a 3-node JetStream cluster, every server cut at once",
    )
    p.add_argument(
        "--merge", action="store_true", help="keep the file's figures of every kind not run now (its count 0)"
    )
    p.add_argument("--seed", type=int, default=1, help="first seed")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if why := unavailable():
        sys.exit(f"the power-cut filesystem cannot run here: {why}")
    found: dict[str, list[str]] = {k: [] for k in CHECKED}
    seconds: dict[str, float] = {}
    restored_behind = 0
    s3_committed = 0
    with tempfile.TemporaryDirectory(prefix="pg-powercut-") as tmp:
        for kind, n, servers in (("service_cuts", args.service_cuts, 1), ("cluster_cuts", args.cluster_cuts, 3)):
            t0 = time.monotonic()
            for i in range(n):
                got = asyncio.run(services_cut(Path(tmp), args.seed + i, servers=servers))
                found[kind] += got
                print(f"{kind} {i + 1}/{n}: {'; '.join(got) or 'ok'}", flush=True)
            seconds[kind] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        for i in range(args.cuts):
            r = checkpoint_cut(Path(tmp), args.seed + i)
            found["checkpoint_cuts"] += r.violations
            if r.violations:
                print(f"  after the cut: {r.durable}\n  restore log: {r.restore_log}", flush=True)
            restored_behind += int(r.restored is not None and r.restored > max(r.acked, default=0))
            print(
                f"cut {i + 1}/{args.cuts} seed {r.seed}: acked {max(r.acked, default=0)}, restored {r.restored}"
                f"{' ' + '; '.join(r.violations) if r.violations else ''}",
                flush=True,
            )
        seconds["checkpoint_cuts"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        for i in range(args.remote_cuts):
            r = checkpoint_cut(Path(tmp), args.seed + i, remote=True)
            found["remote_cuts"] += r.violations
            print(
                f"remote cut {i + 1}/{args.remote_cuts} seed {r.seed}: copied {max(r.remote or [], default=0)}, "
                f"restored {r.restored}{' ' + '; '.join(r.violations) if r.violations else ''}",
                flush=True,
            )
        seconds["remote_cuts"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        for i in range(args.broker_cuts):
            got = asyncio.run(broker_cut(Path(tmp), args.seed + i))
            found["broker_cuts"] += got
            print(f"broker cut {i + 1}/{args.broker_cuts}: {'; '.join(got) or 'ok'}", flush=True)
        seconds["broker_cuts"] = round(time.monotonic() - t0, 1)
        if args.s3_cuts:
            from tests.powercut.s3_campaign import s3_cut
            from tests.s3_peer import BUCKET, SeaweedS3

            t0 = time.monotonic()
            server = SeaweedS3(Path(tmp) / "s3").start()
            env = {k: v for k, v in server.env().items() if k.startswith("AWS_")}
            os.environ.update(env)  # boto3's standard place, for the checks in this process
            committed = 0
            try:
                for i in range(args.s3_cuts):
                    c = s3_cut(Path(tmp), args.seed + i, server, f"s3://{BUCKET}/powercut")
                    found["s3_cuts"] += c.violations
                    committed += c.committed
                    print(
                        f"s3 cut {i + 1}/{args.s3_cuts} seed {c.seed} at {c.after_s:.2f}s: "
                        f"{'committed' if c.committed else 'not committed'}{', acked' if c.acked else ''}"
                        f"{' ' + '; '.join(c.violations) if c.violations else ''}",
                        flush=True,
                    )
            finally:
                server.stop()
            seconds["s3_cuts"] = round(time.monotonic() - t0, 1)
            s3_committed = committed
    counts = {
        "checkpoint_cuts": args.cuts,
        "remote_cuts": args.remote_cuts,
        "broker_cuts": args.broker_cuts,
        "service_cuts": args.service_cuts,
        "cluster_cuts": args.cluster_cuts,
        "s3_cuts": args.s3_cuts,
    }
    old = json.loads(args.out.read_text()) if args.merge and args.out.exists() else {}
    kinds: dict[str, dict] = {}
    for kind, n in counts.items():
        before = (old.get("kinds") or {}).get(kind) or _legacy(old, kind)
        if n == 0 and before:
            kinds[kind] = before
        else:
            kinds[kind] = {"cuts": n, "violations": found[kind], "seconds": seconds.get(kind, 0.0)}
    if args.cuts:
        kinds["checkpoint_cuts"]["restored_the_save_in_flight"] = restored_behind
    if args.s3_cuts:
        kinds["s3_cuts"]["committed"] = s3_committed  # cuts after the COMMIT: the rest cut the copy short
    result = {
        **{k: v["cuts"] for k, v in kinds.items()},
        "violations": sum(len(v["violations"]) for v in kinds.values()),
        "kinds": kinds,
        "checked": CHECKED,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(", ".join(f"{v['cuts']} {k}" for k, v in kinds.items()) + f"; {result['violations']} violations; {args.out}")


def _legacy(old: dict, kind: str) -> dict | None:
    """A kind's figures in the file's earlier layout (counts at the top, one violation list)."""
    if not old.get(kind):
        return None
    prefix = {"service_cuts": "services seed", "broker_cuts": "broker seed"}.get(kind)
    listed = old.get("violation_list", [])
    mine = [v for v in listed if prefix and v.startswith(prefix)] if prefix else []
    if kind == "checkpoint_cuts":
        mine = [v for v in listed if not v.startswith(("services seed", "broker seed"))]
    secs = old.get("service_seconds", 0.0) if kind == "service_cuts" else 0.0
    out = {"cuts": old[kind], "violations": mine, "seconds": secs}
    if kind == "checkpoint_cuts" and "restored_the_save_in_flight" in old:
        out["restored_the_save_in_flight"] = old["restored_the_save_in_flight"]
    return out


if __name__ == "__main__":
    main()
