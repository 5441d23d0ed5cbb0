"""What the checkpoint benchmarks share: the state they save (square linear layers and AdamW
after one step: parameters + two moments = 12 bytes per parameter, sized in GB) and a timer
that starts and stops with every rank at a barrier."""

from __future__ import annotations


def trained_state(size_gb: float, width: int, *, device: str = "cpu", ddp: bool = False):
    """(model, the module to train: DDP-wrapped when ``ddp``, optimizer, bytes of the state)."""
    import torch
    from torch import nn

    layers = max(1, round(size_gb * 1e9 / 12 / (width * width)))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)]).to(device)
    module = model
    if ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        module = DDP(model)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
    module(torch.randn(2, width, device=device)).sum().backward()
    opt.step()
    return model, module, opt, sum(p.numel() * 12 for p in model.parameters())


def barrier_timer(group):
    """``timed(fn)``: seconds ``fn`` takes with every rank of ``group`` starting and ending together."""
    import time

    import torch.distributed as dist

    def timed(fn) -> float:
        dist.barrier(group)
        t0 = time.perf_counter()
        fn()
        dist.barrier(group)
        return time.perf_counter() - t0

    return timed
