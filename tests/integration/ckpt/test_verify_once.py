"""Each file of a checkpoint is hashed once per restore, by the rank that loads most of it, not
by every rank that loads an item from it (2 real gloo ranks): DCP stores a replicated tensor or
value once, in one rank's file, and every rank loads it; the other rank reads just that item
(a value through the restore's planner, which runs no code). A flipped byte
in either file still fails the load on both ranks, naming the file (the verifier's failure
reaches every rank through DCP's all-gather of the reads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from powerguard.ckpt_agent._loading import verifiers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TORCHRUN = Path(sys.executable).parent / "torchrun"
SCRIPT = Path(__file__).parent / "scripts" / "verify_once.py"


def ranks(mode: str, ckpt: Path, *args: str) -> list[dict]:
    """Each rank's report, by rank."""
    out = ckpt.parent / f"{mode}-out"
    out.mkdir(exist_ok=True)
    for old in out.glob("rank*.json"):
        old.unlink()
    argv = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(SCRIPT), mode, str(ckpt), str(out), *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, f"{mode} exit {r.returncode}: " + r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads((out / f"rank{n}.json").read_text()) for n in range(2)]


def test_each_file_is_hashed_once_and_a_flipped_byte_in_any_fails_every_rank(tmp_path):
    ckpt = tmp_path / "ckpt"
    files = {name: entry for r in ranks("save", ckpt) for name, entry in r["files"].items()}
    manifest = json.dumps(files)
    clean = ranks("load", ckpt, manifest)
    assert [r["outcome"] for r in clean] == ["exact", "exact"]
    hashed = [name for r in clean for name in r["hashed"]]
    assert sorted(hashed) == sorted(files), f"hashed {hashed}: each of {sorted(files)} exactly once"
    for name in files:
        path = ckpt / name
        good = path.read_bytes()
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0x01
        path.write_bytes(bytes(bad))
        try:
            outcomes = [r["outcome"] for r in ranks("load", ckpt, manifest)]
        finally:
            path.write_bytes(good)
        assert all(o.startswith("failed") and name in o and "checksum mismatch" in o for o in outcomes), outcomes


class _Info:
    def __init__(self, path: str, length: int) -> None:
        self.relative_path, self.length = path, length


class _Item:
    def __init__(self, index: str) -> None:
        self.storage_index = index


class _Plan:
    def __init__(self, *indexes: str) -> None:
        self.items = [_Item(i) for i in indexes]


def test_the_verifier_of_a_file_is_the_rank_loading_most_of_it_the_lowest_on_a_tie():
    data = {"a0": _Info("A", 100), "a1": _Info("A", 5), "b0": _Info("B", 100), "b1": _Info("B", 100)}
    data["c"] = _Info("C", 9)
    plans = [_Plan("a0", "a1", "b0"), _Plan("a1", "b1"), _Plan()]
    assert verifiers(data, plans) == [frozenset({"A", "B"}), frozenset(), frozenset()]
    assert verifiers(data, [_Plan("a1", "b1"), _Plan("a0", "b0", "c")]) == [frozenset({"B"}), frozenset({"A", "C"})]
