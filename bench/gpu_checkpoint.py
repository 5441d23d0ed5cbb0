"""Power checkpoint of a device-resident state: staging to host memory and the training stall.

One process, the model and AdamW state on the GPU when there is one (CPU otherwise), sized by
--size-gb (the seed's figure for one node is ~8.5 GB; CI runs it tiny on CPU):

  * device -> host staging into buffers allocated once and reused (pinned on a GPU, as the
    ckpt-agent's ReusingStager does), against a fresh ``.cpu()`` copy of every tensor: GB/s
  * the training stall of a power checkpoint: ``CheckpointAgent.save`` of the state (agreement
    aside, a power checkpoint is synchronous: the training thread waits for the durable commit)
  * the same save to a local directory, broken into write and commit

Writes bench/results/gpu_checkpoint.json (``--out``), naming the device it ran on.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "gpu_checkpoint.json"


def run(size_gb: float, reps: int, directory: Path) -> dict:
    import torch
    from _state import trained_state
    from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

    from powerguard.ckpt_agent import CheckpointAgent

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    model, _, opt, nbytes = trained_state(size_gb, 4096 if size_gb >= 1 else 1024, device=str(device))
    state = {"model": model.state_dict(), "optim": opt.state_dict()}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    cache = _create_cpu_state_dict(state, pin_memory=cuda)
    reused, fresh = [], []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        _copy_state_dict(state, cache)
        sync()
        reused.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        # a fresh host copy of every tensor (on a CPU-only box .cpu() would not copy: clone)
        copy = (lambda t: t.detach().cpu()) if cuda else (lambda t: t.detach().clone())
        _ = [copy(p) for p in model.parameters()] + [
            copy(t) for s in opt.state.values() for t in s.values() if torch.is_tensor(t)
        ]
        sync()
        fresh.append(time.perf_counter() - t0)
    guard = CheckpointAgent(job="gpu-bench", model=model, optimizer=opt, local_dir=directory, local_every_s=0, keep=1)
    saves = []
    for i in range(reps):
        sync()
        t0 = time.perf_counter()
        info = guard.save(i)
        saves.append((time.perf_counter() - t0, info.write_s, info.commit_s))
    guard.close()
    stall = statistics.median(s[0] for s in saves)
    gb = nbytes / 1e9
    return {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "state_gb": round(gb, 3),
        "reps": reps,
        "staging_reused_buffers_gb_s": round(gb / statistics.median(reused), 2),
        "staging_fresh_copy_gb_s": round(gb / statistics.median(fresh), 2),
        "pinned": cuda,
        "power_checkpoint_stall_s": round(stall, 3),
        "power_checkpoint_write_s": round(statistics.median(s[1] for s in saves), 3),
        "power_checkpoint_commit_s": round(statistics.median(s[2] for s in saves), 3),
        "power_checkpoint_gb_s": round(gb / stall, 2),
        "stall_at_8_5_gb_s_extrapolated": round(stall * 8.5 / gb, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gb", type=float, default=8.5, help="model + AdamW state (default 8.5, one node's)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir on the project's disk)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="pg-bench-gpu-", dir=Path(__file__).parent))
    try:
        r = run(args.size_gb, args.reps, base)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    Path(args.out).write_text(json.dumps(r, indent=2) + "\n")
    print(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
