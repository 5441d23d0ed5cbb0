"""One rank of the verify-once test (torchrun, gloo on CPU): a state of a row-sharded DTensor and
replicated tensors (DCP stores each of those once, in one rank's file, and every rank loads it),
saved with the agent's HashingWriter, then loaded with its VerifyingReader. Writes
``<out>/rank<N>.json`` per rank: the files it wrote (save), or the files it hashed whole and the
load's outcome (load)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

from powerguard.ckpt_agent._hashing import HashingWriter
from powerguard.ckpt_agent._loading import SafeLoadPlanner, VerifyingReader
from powerguard.sim._framework_job import exit_finished


def state(mesh, fill: float | None) -> dict:
    g = torch.Generator().manual_seed(7)
    full = torch.randn(64, 256, generator=g)
    out = {"w": distribute_tensor(full, mesh, [Shard(0)])}
    out |= {f"r{i}": torch.randn(16, generator=g) for i in range(4)}  # the same on every rank
    if fill is not None:
        for t in out.values():
            (t.to_local() if hasattr(t, "to_local") else t).fill_(fill)
    out |= {f"hp{i}": {"lr": 0.5 if fill is None else 0.0, "betas": (0.9, 0.99)} for i in range(4)}  # bytes items
    return out


def main() -> None:
    mode, directory, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if mode == "save":
        writer = HashingWriter(directory, sync_files=False, thread_count=1)
        dcp.save(state(mesh, None), storage_writer=writer)
        report = {"files": writer.data_files()}
    else:
        manifest = json.loads(sys.argv[4])
        got = state(mesh, 0.0)
        reader = VerifyingReader(directory, files=manifest, key=None)
        try:
            dcp.load(got, storage_reader=reader, planner=SafeLoadPlanner())
            want = state(mesh, None)
            exact = all(
                torch.equal(_local(got[k]), _local(v)) if isinstance(v, torch.Tensor) else got[k] == v
                for k, v in want.items()
            )
            outcome = "exact" if exact else "differs"
        except CheckpointException as exc:  # DCP's (a BaseException): every rank's failures
            outcome = f"failed: {exc}"
        report = {"hashed": reader.hashed, "outcome": outcome}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(report))
    dist.barrier()  # neither rank tears down the group while the other still uses it
    dist.destroy_process_group()


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


if __name__ == "__main__":
    main()
    exit_finished(0)  # the DTensors' mesh keeps the gloo group: no finalization (it aborted 1 run in 30)
