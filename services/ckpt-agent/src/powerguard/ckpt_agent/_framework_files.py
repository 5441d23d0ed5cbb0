"""A framework's checkpoint files checked before the framework loads them, without running code.

Lightning (``checkpoint.ckpt``) and the HF Trainer (``optimizer.pt``, ``scheduler.pt``,
``scaler.pt``, ``rng_state*.pth``, ``pytorch_model*.bin``) read their files with ``torch.load``:
with ``weights_only=True`` (the Trainer always; Lightning when ``trainer.fit(...,
weights_only=True)``, as the docs say) a pickle that names anything but tensors and plain values
makes the load raise, and without it the load runs that code. Without a site key the COMMIT's
checksums only catch corruption (a forger recomputes them), so before a checkpoint is offered
for resuming, every file the framework will load is scanned for the globals its pickle names
(``torch.serialization.get_unsafe_globals_in_checkpoint``: reads the pickle's opcodes, runs
nothing) and one that names anything outside torch's ``weights_only`` set (and the few NumPy
types the Trainer admits for its RNG state) is refused: the resume falls back to the previous
checkpoint instead of raising in the framework or running code.
"""

from __future__ import annotations

import fnmatch
import os
import zipfile

import torch

from .errors import CorruptCheckpoint

# the files each framework's resume reads with torch.load
LOADED: dict[str, tuple[str, ...]] = {
    "lightning": ("*.ckpt",),
    "hf": ("optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state*.pth", "pytorch_model*.bin"),
}
# beside torch's weights_only set: what the framework itself admits for that load (the Trainer's
# RNG state holds NumPy's generator state: it loads it inside torch.serialization.safe_globals)
ADMITTED: dict[str, frozenset[str]] = {
    "lightning": frozenset(),
    "hf": frozenset(
        {
            "numpy.core.multiarray._reconstruct",
            "numpy._core.multiarray._reconstruct",
            "numpy.ndarray",
            "numpy.dtype",
            "numpy.dtypes.UInt32DType",
        }
    ),
}


class UnsafeFrameworkFile(CorruptCheckpoint):
    """A file the framework would load names code, not data: it is never loaded."""


def check_framework_files(directory: str, framework: str) -> None:
    """Raise :class:`UnsafeFrameworkFile` (or :class:`CorruptCheckpoint`) unless every file of
    ``directory`` that ``framework`` loads with ``torch.load`` holds only tensors and plain values."""
    patterns = LOADED.get(framework, ())
    for name in sorted(os.listdir(directory)):
        if not any(fnmatch.fnmatch(name, p) for p in patterns):
            continue
        path = os.path.join(directory, name)
        if not zipfile.is_zipfile(path):
            raise UnsafeFrameworkFile(f"{path}: not torch's zip format (a bare pickle): not loaded")
        try:
            named = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception as exc:  # a pickle that does not parse
            raise CorruptCheckpoint(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
        unsafe = sorted(set(named) - ADMITTED.get(framework, frozenset()))
        if unsafe:
            raise UnsafeFrameworkFile(
                f"{path}: names {', '.join(unsafe)} (not tensors and plain values): not loaded, no code runs"
            )
