"""The power-cut filesystem itself: what a cut keeps and what it loses."""

from __future__ import annotations

import os


def fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(path, data: bytes, *, sync: bool) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def test_an_unsynced_write_is_gone_after_a_cut_and_a_synced_one_stays(powercut):
    m = powercut.mountpoint
    write(m / "synced", b"durable", sync=True)
    write(m / "unsynced", b"lost", sync=False)
    fsync_dir(m)  # both names are durable; only one file's data is
    assert (m / "unsynced").read_bytes() == b"lost"  # before the cut: the page cache
    with open(m / "synced", "ab") as f:
        f.write(b" and more")  # appended, never synced
    powercut.cut()
    powercut.start()
    assert (m / "synced").read_bytes() == b"durable"
    assert (m / "unsynced").read_bytes() == b""  # the name was durable, its data never was


def test_a_new_file_without_its_directorys_fsync_is_gone_even_when_its_data_was_synced(powercut):
    m = powercut.mountpoint
    write(m / "orphan", b"data", sync=True)
    powercut.cut()
    powercut.start()
    assert not (m / "orphan").exists()


def test_a_rename_without_the_directorys_fsync_may_be_undone(powercut):
    """write tmp, fsync tmp, rename over the target: without an fsync of the directory the
    target still has its old content after a cut (and the tmp file is back)."""
    m = powercut.mountpoint
    write(m / "state", b"old", sync=True)
    fsync_dir(m)
    write(m / "state.tmp", b"new", sync=True)
    os.replace(m / "state.tmp", m / "state")
    assert (m / "state").read_bytes() == b"new"
    powercut.cut()
    powercut.start()
    assert (m / "state").read_bytes() == b"old"
    assert not (m / "state.tmp").exists()  # created after the last directory fsync
    write(m / "state.tmp", b"new", sync=True)
    os.replace(m / "state.tmp", m / "state")
    fsync_dir(m)
    powercut.cut()
    powercut.start()
    assert (m / "state").read_bytes() == b"new"


def test_an_unlink_without_the_directorys_fsync_is_undone(powercut):
    m = powercut.mountpoint
    write(m / "keep", b"k", sync=True)
    fsync_dir(m)
    os.unlink(m / "keep")
    powercut.cut()
    powercut.start()
    assert (m / "keep").read_bytes() == b"k"


def test_a_new_directory_is_reachable_only_once_its_parent_was_synced(powercut):
    m = powercut.mountpoint
    (m / "a" / "b").mkdir(parents=True)
    write(m / "a" / "b" / "f", b"x", sync=True)
    fsync_dir(m / "a" / "b")
    fsync_dir(m / "a")  # a knows b; the root does not know a yet
    powercut.cut()
    powercut.start()
    assert not (m / "a").exists()
    (m / "a" / "b").mkdir(parents=True)
    write(m / "a" / "b" / "f", b"x", sync=True)
    for d in (m / "a" / "b", m / "a", m):
        fsync_dir(d)
    powercut.cut()
    powercut.start()
    assert (m / "a" / "b" / "f").read_bytes() == b"x"


def test_a_clean_unmount_keeps_everything(powercut):
    m = powercut.mountpoint
    write(m / "f", b"unsynced but unmounted cleanly", sync=False)
    powercut.stop()
    powercut.start()
    assert (m / "f").read_bytes() == b"unsynced but unmounted cleanly"


def test_in_journal_mode_any_fsync_makes_every_earlier_name_durable_but_not_other_data(powercut_journal):
    m = powercut_journal.mountpoint
    (m / "d").mkdir()
    write(m / "d" / "other", b"never synced", sync=False)
    write(m / "d" / "f", b"synced", sync=True)  # no directory fsync anywhere
    powercut_journal.cut()
    powercut_journal.start()
    assert (m / "d" / "f").read_bytes() == b"synced"
    assert (m / "d" / "other").read_bytes() == b""  # its name came with the journal, its data did not
