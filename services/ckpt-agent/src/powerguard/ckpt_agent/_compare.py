"""Two checkpoints compared tensor by tensor (``powerguard check-resume``): every entry of each
(model, optimizer, scheduler, registered state, every rank's RNG), read with DCP into whole
tensors (sharded ones assembled) through the reader that unpickles nothing arbitrary."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ._loading import SafeEmptyLoadPlanner
from ._metadata import SafeFileSystemReader

# what usually makes an entry differ after a resume, by where it is
CAUSES = {
    "model": "the model: state fetched ahead (a batch drawn inside the step), gradients not zeroed before "
    "the first step, an unseeded data order, or a GradScaler / accumulation counter not registered",
    "optim": "the optimizer: as for the model (its state follows the gradients)",
    "scheduler": "the LR scheduler: stepped outside the optimizer steps the agent counts",
    "extra": "registered state: a value that depends on something not registered",
    "rng": "an RNG: something draws random numbers between the checkpoint and the step (a data loader "
    "worker, an augmentation, a prefetch)",
}


def entries(directory: str) -> dict[str, Any]:
    """Every entry of the checkpoint in ``directory``, flattened (``model.0.weight``, ...)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}  # one process, on purpose: the planner rebuilds it from the metadata
    _load_state_dict(state, SafeFileSystemReader(directory), no_dist=True, planner=SafeEmptyLoadPlanner())
    return dict(_flat(state))


def _flat(d: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


@dataclass
class Comparison:
    same: list[str] = field(default_factory=list)
    differ: list[tuple[str, str]] = field(default_factory=list)  # (entry, how)
    only_in_first: list[str] = field(default_factory=list)
    only_in_second: list[str] = field(default_factory=list)

    @property
    def state_differs(self) -> list[tuple[str, str]]:
        """What the training state holds that differs: the verdict (RNG states apart)."""
        return [(k, how) for k, how in self.differ if _kind(k) != "rng"]

    @property
    def rng_differs(self) -> list[str]:
        """RNG states that differ: an unseeded generator (two runs of the same command start from
        different states) or one drawn from outside the steps; no verdict by themselves."""
        return [k for k, _ in self.differ if _kind(k) == "rng"]

    @property
    def equal(self) -> bool:
        return not (self.state_differs or self.only_in_first or self.only_in_second)

    def causes(self) -> list[str]:
        """The usual causes for the kinds of entries that differ."""
        kinds = {_kind(k) for k, _ in self.state_differs}
        return [CAUSES[k] for k in CAUSES if k in kinds]


def _kind(key: str) -> str:
    if key.endswith(".rng") or ".rng." in key:
        return "rng"
    head = key.split(".", 1)[0]
    return head if head in CAUSES else "extra"


def compare(first: str, second: str) -> Comparison:
    a, b = entries(first), entries(second)
    out = Comparison(only_in_first=sorted(a.keys() - b.keys()), only_in_second=sorted(b.keys() - a.keys()))
    for key in sorted(a.keys() & b.keys()):
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                out.differ.append((key, f"{tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}"))
            elif not torch.equal(x, y):
                diff = (x.double() - y.double()).abs()
                out.differ.append((key, f"{int((diff > 0).sum())} of {x.numel()} values, max |diff| {diff.max():.3g}"))
            else:
                out.same.append(key)
        elif x == y:
            out.same.append(key)
        else:
            out.differ.append((key, f"{x!r} vs {y!r}"))
    return out
