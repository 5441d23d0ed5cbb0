"""A FUSE passthrough that loses, on a power cut, everything not yet made durable (as LazyFS does
for Jepsen): file data until an fsync/fdatasync of that file; creates, renames, unlinks, links
and mkdirs until an fsync of their directory.

Layout of ``ROOT``::

    live/           what the mount shows: every change lands here at once (the page cache)
    files/<uid>     the durable data of one file (written on its fsync)
    dirs/<uid>.json the durable entries of one directory, name -> [kind, uid | link target]
                    (written on its fsync; the root directory is ``root``)
    uids.json       live inode number -> uid (written when the mount ends)

Two modes (``mode`` at :func:`init`): ``posix`` (the default) makes a name durable only by an
fsync of its directory, as POSIX promises and LazyFS enforces; ``journal`` models a journaling
file system's metadata (ext4's default ``data=ordered``, XFS): any fsync commits the journal,
so every create, rename, unlink and mkdir made before it is durable with it; file data still
only by that file's fsync.

A uid names a file or directory for its whole life (its inode), whatever its names. A cut
(:func:`cut`, with the mount gone) rebuilds ``live/`` from what is durable: the directories
reachable from ``root`` through durable entries, each file with its durable data (empty when its
data was never synced). A directory whose own fsync came before its parent's made its entries
durable, but it is reachable only once the parent's entry for it is: as on a real disk.

Run: ``python -m powerguard.sim.powercut_fs ROOT MOUNTPOINT`` (foreground; unmount with ``fusermount3 -u``).
Library: mfusepy (ctypes over libfuse 3: no compiler, no async runtime; pyfuse3 needs a build
and trio). Used by the tests (tests/powercut), bench/powercut.py and `powerguard demo --blackout`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import sys
import threading
import uuid
from pathlib import Path

import mfusepy
from mfusepy import FuseOSError, Operations

ROOT_UID = "root"


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


MODES = ("posix", "journal")


def init(root: Path, mode: str = "posix") -> None:
    """An empty power-cut filesystem under ``root``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    root = Path(root)
    for sub in ("live", "files", "dirs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "mode").write_text(mode)
    _write_atomic(root / "dirs" / f"{ROOT_UID}.json", b"{}")
    _write_atomic(root / "uids.json", json.dumps({str(os.lstat(root / "live").st_ino): ROOT_UID}).encode())


def cut(root: Path) -> None:
    """Power is cut (the mount must be gone): ``live/`` becomes what was durable."""
    root = Path(root)
    live = root / "live"
    for child in list(live.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    uids = materialize(root, live)
    _write_atomic(root / "uids.json", json.dumps(uids).encode())


def materialize(root: Path, target: Path) -> dict[str, str]:
    """Build what is durable now into the empty directory ``target`` (a cut does it into
    ``live/``; a test may do it elsewhere to look while the mount runs). Returns inode -> uid."""
    root, target = Path(root), Path(target)
    uids = {str(os.lstat(target).st_ino): ROOT_UID}
    linked: dict[str, Path] = {}

    def build(dir_uid: str, at: Path, seen: set[str]) -> None:
        if dir_uid in seen:  # a directory reachable twice (cannot happen on a real disk)
            return
        seen.add(dir_uid)
        entries_file = root / "dirs" / f"{dir_uid}.json"
        entries = json.loads(entries_file.read_text()) if entries_file.exists() else {}
        for name, (kind, ref) in sorted(entries.items()):
            path = at / name
            if kind == "dir":
                path.mkdir()
                uids[str(os.lstat(path).st_ino)] = ref
                build(ref, path, seen)
            elif kind == "symlink":
                os.symlink(ref, path)
            elif ref in linked:  # a hard link of a file already placed
                os.link(linked[ref], path)
            else:
                data = root / "files" / ref
                if data.exists():
                    shutil.copyfile(data, path)
                else:
                    path.write_bytes(b"")
                linked[ref] = path
                uids[str(os.lstat(path).st_ino)] = ref

    build(ROOT_UID, target, set())
    return uids


class PowerCutOps(Operations):
    use_ns = True

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.live = str(self.root / "live")
        self._lock = threading.RLock()
        self._uids: dict[int, str] = {int(k): v for k, v in json.loads((self.root / "uids.json").read_text()).items()}
        self.journal = (self.root / "mode").read_text().strip() == "journal"
        self._trace = open(self.root / "trace.log", "a") if os.environ.get("POWERCUT_TRACE") else None

    def trace(self, *what: object) -> None:
        if self._trace is not None:
            with self._lock:
                self._trace.write(" ".join(str(w) for w in what) + "\n")
                self._trace.flush()

    # ------------------------------------------------------------------ bookkeeping
    def _real(self, path: str) -> str:
        return self.live + path

    def _uid(self, ino: int) -> str:
        with self._lock:
            uid = self._uids.get(ino)
            if uid is None:
                uid = self._uids[ino] = uuid.uuid4().hex
            return uid

    def _fresh(self, real: str) -> None:
        """A new inode got a name: it is a new file or directory, whatever its number was."""
        with self._lock:
            ino = os.lstat(real).st_ino
            self._uids[ino] = uuid.uuid4().hex
            self.trace("fresh", real.removeprefix(self.live), ino, self._uids[ino])

    def save_uids(self) -> None:
        with self._lock:
            _write_atomic(self.root / "uids.json", json.dumps({str(k): v for k, v in self._uids.items()}).encode())

    # ------------------------------------------------------------------ durability
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        st = os.fstat(fh)
        if stat.S_ISDIR(st.st_mode):
            return self._sync_dir(path)
        uid = self._uid(st.st_ino)
        # the handle may be write-only: read the same inode (even unlinked) through /proc
        reader = os.open(f"/proc/self/fd/{fh}", os.O_RDONLY)
        try:
            chunks, offset = [], 0
            while chunk := os.pread(reader, 1 << 20, offset):
                chunks.append(chunk)
                offset += len(chunk)
        finally:
            os.close(reader)
        _write_atomic(self.root / "files" / uid, b"".join(chunks))
        self.trace("fsync", path, uid, offset)
        if self.journal:
            self._commit_journal()
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return self._sync_dir(path)

    def _commit_journal(self) -> None:
        """Every directory's entries as they are now (a journal commit)."""
        for dirpath, _, _ in os.walk(self.live):
            try:
                self._sync_entries(dirpath)
            except FileNotFoundError:  # removed while walked
                continue

    def _sync_dir(self, path: str) -> int:
        if self.journal:
            self._commit_journal()
        else:
            self._sync_entries(self._real(path))
        return 0

    def _sync_entries(self, real: str) -> None:
        entries: dict[str, list[str]] = {}
        with os.scandir(real) as it:
            for e in it:
                try:
                    st = os.lstat(e.path)
                except FileNotFoundError:  # unlinked while listed (another thread): not an entry now
                    continue
                if stat.S_ISDIR(st.st_mode):
                    entries[e.name] = ["dir", self._uid(st.st_ino)]
                elif stat.S_ISLNK(st.st_mode):
                    try:
                        entries[e.name] = ["symlink", os.readlink(e.path)]
                    except FileNotFoundError:
                        continue
                elif stat.S_ISREG(st.st_mode):
                    entries[e.name] = ["file", self._uid(st.st_ino)]
        uid = self._uid(os.lstat(real).st_ino)
        _write_atomic(self.root / "dirs" / f"{uid}.json", json.dumps(entries).encode())
        self.trace("fsyncdir", real.removeprefix(self.live), uid, sorted(entries))

    # ------------------------------------------------------------------ passthrough
    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise FuseOSError(errno.EACCES)
        return 0

    def getattr(self, path: str, fh: int | None = None) -> dict:
        try:
            st = os.fstat(fh) if fh is not None else os.lstat(self._real(path))
        except OSError as exc:
            raise FuseOSError(exc.errno) from None
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino", "st_blocks", "st_blksize")
        out = {k: getattr(st, k) for k in keys}
        out.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return out

    def readdir(self, path: str, fh: int):
        return [".", "..", *os.listdir(self._real(path))]

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def statfs(self, path: str) -> dict:
        sv = os.statvfs(self._real(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize")
        return {k: getattr(sv, k) for k in keys} | {"f_namemax": sv.f_namemax}

    def open(self, path: str, flags: int) -> int:
        return self._os(os.open, self._real(path), flags)

    def create(self, path: str, mode: int, fi=None) -> int:
        real = self._real(path)
        existed = os.path.lexists(real)
        fd = self._os(os.open, real, os.O_RDWR | os.O_CREAT, mode)
        if not existed:
            self._fresh(real)
        return fd

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return self._os(os.pread, fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return self._os(os.pwrite, fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None:
            self._os(os.ftruncate, fh, length)
        else:
            self._os(os.truncate, self._real(path), length)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0  # close() is not fsync: nothing becomes durable

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def opendir(self, path: str) -> int:
        return self._os(os.open, self._real(path), os.O_RDONLY | os.O_DIRECTORY)

    def releasedir(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        real = self._real(path)
        self._os(os.mkdir, real, mode)
        self._fresh(real)
        return 0

    def rmdir(self, path: str) -> int:
        self._os(os.rmdir, self._real(path))
        return 0

    def unlink(self, path: str) -> int:
        self._os(os.unlink, self._real(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        self._os(os.rename, self._real(old), self._real(new))
        return 0

    def link(self, target: str, source: str) -> int:
        self._os(os.link, self._real(source), self._real(target))
        return 0

    def symlink(self, target: str, source: str) -> int:
        self._os(os.symlink, source, self._real(target))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        self._os(os.chmod, self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._os(os.chown, self._real(path), uid, gid)
        return 0

    def utimens(self, path: str, times=None) -> int:
        self._os(os.utime, self._real(path), ns=times) if times else self._os(os.utime, self._real(path))
        return 0

    @staticmethod
    def _os(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            raise FuseOSError(exc.errno or errno.EIO) from None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m powerguard.sim.powercut_fs ROOT MOUNTPOINT", file=sys.stderr)
        return 2
    root, mountpoint = Path(argv[0]), argv[1]
    if not (root / "uids.json").exists():
        init(root)
    ops = PowerCutOps(root)
    try:
        mfusepy.FUSE(ops, mountpoint, foreground=True, nothreads=False, default_permissions=True)
    finally:
        ops.save_uids()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
