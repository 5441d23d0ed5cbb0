"""How the simulated job spreads its model over the ranks (``--shard``): DDP, FSDP2, tensor
parallel, HSDP (FSDP2 on a 2-D mesh: shards within a group, replicas across groups) and
FSDP2 + tensor parallel (a 2-D mesh: data parallel x tensor parallel). Gloo on CPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch import nn

SHARDS = ("ddp", "fsdp", "tp", "hsdp", "fsdp-tp")
TWO_D = ("hsdp", "fsdp-tp")  # a 2-D mesh: an even number of ranks, at least 4


def parallelize(model: nn.Sequential, shard: str, *, ddp_hook: Callable) -> tuple[nn.Module, dict[str, Any]]:
    """(the model to train, the sampler's replicas/rank: every rank of a tensor-parallel group
    trains on the same batch, or a replicated parameter such as a row-parallel bias drifts apart)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    world, rank = dist.get_world_size(), dist.get_rank()
    linears = [m for m in model if isinstance(m, nn.Linear)]
    tp_plan = {"0": ColwiseParallel(), "3": RowwiseParallel()}  # the first layer by columns, the last by rows
    if shard in TWO_D and (world < 4 or world % 2):
        raise ValueError(f"--shard {shard} needs an even number of ranks, at least 4 (a 2-D mesh), not {world}")
    if shard == "fsdp":
        mesh = init_device_mesh("cpu", (world,))
        for layer in linears:
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh), {}
    if shard == "tp":
        mesh = init_device_mesh("cpu", (world,))
        return parallelize_module(model, mesh, tp_plan), {"num_replicas": 1, "rank": 0}
    if shard == "hsdp":  # replicate over the first dimension, shard over the second
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        for layer in linears:
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh), {}
    if shard == "fsdp-tp":  # tensor parallel within pairs of ranks, FSDP2 across the pairs
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], tp_plan)
        for layer in linears:
            fully_shard(layer, mesh=mesh["dp"])
        return fully_shard(model, mesh=mesh["dp"]), {"num_replicas": world // 2, "rank": rank // 2}
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model)
    # sum gradients in rank order: the result then does not depend on DDP's bucket layout, which it
    # rebuilds after its first iteration - a restarted run does that at another step, and with more
    # than two ranks a ring all-reduce adds in a layout-dependent order (resume would be off by 1e-8)
    ddp.register_comm_hook(None, ddp_hook)
    return ddp, {}
