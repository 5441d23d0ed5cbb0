"""A DCP FileSystemWriter that checksums every byte as it is written (xxh3-128), so the
manifest costs no second read of the checkpoint."""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

import xxhash
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem


class _HashingStream(io.RawIOBase):
    """Forwards writes to a file and hashes them; DCP writes each file sequentially."""

    def __init__(self, raw: io.BufferedWriter) -> None:
        self._raw = raw
        self.hasher = xxhash.xxh3_128()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        mv = memoryview(b).cast("B")
        self.hasher.update(mv)
        self.size += mv.nbytes
        return self._raw.write(mv)

    def tell(self) -> int:
        return self._raw.tell()

    def seekable(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._raw.fileno()

    def flush(self) -> None:
        if not self._raw.closed:
            self._raw.flush()

    def close(self) -> None:
        if not self.closed:
            super().close()  # flushes
            self._raw.close()


class HashingFileSystem(FileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, dict[str, object]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as s:
                yield s
            return
        p = Path(path)
        with p.open(mode) as raw:
            stream = _HashingStream(raw)
            yield stream
            stream.close()
        with self._lock:
            self.files[p.name] = {"size": stream.size, "xxh3": stream.hasher.hexdigest()}


class HashingWriter(FileSystemWriter):
    """``FileSystemWriter`` whose data files are checksummed while written (fsync kept)."""

    def __init__(self, path: str | os.PathLike, **kwargs) -> None:
        super().__init__(path, **kwargs)
        self.fs = HashingFileSystem()

    def data_files(self) -> dict[str, dict[str, object]]:
        """name -> {size, xxh3} of the data files this rank wrote (not DCP's .metadata)."""
        return {n: v for n, v in self.fs.files.items() if not n.startswith(".metadata")}
