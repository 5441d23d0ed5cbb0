"""check-resume's RNG note names only the generators the resumed run drew from."""

from pathlib import Path
from types import SimpleNamespace

from powerguard.cli.resume_check import _drawn_from


def _compare_changing(*keys):
    calls = []

    def compare(a, b):
        calls.append((a, b))
        return SimpleNamespace(rng_differs=list(keys))

    return compare, calls


def test_a_generator_the_run_never_drew_from_is_not_named(tmp_path: Path):
    stopped, final = tmp_path / "step-3", tmp_path / "step-6"
    stopped.mkdir()
    (stopped / "COMMIT").write_text("")
    compare, calls = _compare_changing("rng.torch")
    assert _drawn_from(compare, stopped, final, ["rng.torch", "rng.numpy"]) == ["rng.torch"]
    assert calls == [(str(stopped), str(final))]


def test_without_the_stops_checkpoint_every_difference_is_named(tmp_path: Path):
    stopped, final = tmp_path / "step-3", tmp_path / "step-6"
    compare, calls = _compare_changing()
    assert _drawn_from(compare, stopped, final, ["rng.numpy"]) == ["rng.numpy"]
    assert calls == []
