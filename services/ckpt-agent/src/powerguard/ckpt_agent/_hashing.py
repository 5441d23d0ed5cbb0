"""A DCP FileSystemWriter that checksums every byte as it is written (xxh3-128, and a keyed
BLAKE2b-256 with a site key), so the manifest costs no second read of the checkpoint.

Its writer threads skip ``torch.save``'s CRC32 of every record (torch's
``serialization.config.save.compute_crc32``, patched for the writing thread only: torch's config
patches are thread-local, so the training's own ``torch.save`` calls keep it). The file's xxh3,
which the restore verifies before loading, covers every byte the CRC32s would; ``torch.load``
reads such records (it does not check them). Measured (``bench/power_checkpoint.py``, perf): the
CRC32 was a fifth of the CPU of a save on a 2-core node, more than the xxh3 itself."""

from __future__ import annotations

import hashlib
import io
import os
import threading
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

import xxhash
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.utils.serialization import config as torch_serialization

from ._keys import KEYED


class _HashingStream(io.RawIOBase):
    """Forwards writes to a file and hashes them; DCP writes each file sequentially."""

    def __init__(self, raw: io.BufferedWriter, key: bytes | None = None) -> None:
        self._raw = raw
        self.hasher = xxhash.xxh3_128()
        self.keyed = hashlib.blake2b(key=key, digest_size=32) if key is not None else None
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        mv = memoryview(b).cast("B")
        self.hasher.update(mv)
        if self.keyed is not None:
            self.keyed.update(mv)
        self.size += mv.nbytes
        return self._raw.write(mv)

    def tell(self) -> int:
        return self._raw.tell()

    def seekable(self) -> bool:
        return False

    def fileno(self) -> int:
        # DCP fsyncs ``fileno()`` without flushing first (torch 2.13's ``finish`` pickles
        # ``.metadata`` into a buffered stream and fsyncs it): what sat in the buffer was never
        # synced and a power cut emptied ``.metadata`` (tests/powercut). Whoever asks for the
        # descriptor gets it with every byte written so far handed to the kernel.
        self.flush()
        return self._raw.fileno()

    def flush(self) -> None:
        if not self._raw.closed:
            self._raw.flush()

    def close(self) -> None:
        if not self.closed:
            super().close()  # flushes
            self._raw.close()


class HashingFileSystem(FileSystem):
    def __init__(self, key: bytes | None = None) -> None:
        super().__init__()
        self.key = key
        self.files: dict[str, dict[str, object]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as s:
                yield s
            return
        p = Path(path)
        # DCP writes a file's records from the thread that opened it: no CRC32 for them (see above)
        with p.open(mode) as raw, torch_serialization.patch("save.compute_crc32", False):
            stream = _HashingStream(raw, self.key)
            yield stream
            stream.close()
        entry: dict[str, object] = {"size": stream.size, "xxh3": stream.hasher.hexdigest()}
        if stream.keyed is not None:
            entry[KEYED] = stream.keyed.hexdigest()
        with self._lock:
            self.files[p.name] = entry


class HashingWriter(FileSystemWriter):
    """``FileSystemWriter`` whose data files are checksummed while written (fsync kept)."""

    def __init__(self, path: str | os.PathLike, *, key: bytes | None = None, **kwargs) -> None:
        super().__init__(path, **kwargs)
        self.fs = HashingFileSystem(key)

    def data_files(self) -> dict[str, dict[str, object]]:
        """name -> {size, xxh3} of the data files this rank wrote (not DCP's .metadata)."""
        return {n: v for n, v in self.fs.files.items() if not n.startswith(".metadata")}
