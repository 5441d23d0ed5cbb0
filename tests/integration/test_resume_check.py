"""``powerguard check-resume`` on a script that draws its next batch ahead: it names the tensors
that differ and the usual cause; on the fixed script it says the resume is exact."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parent / "resume_scripts" / "fetch_ahead.py"
POWERGUARD = Path(sys.executable).parent / "powerguard"


def check(tmp_path: Path, *script_args: str) -> subprocess.CompletedProcess:
    argv = [str(POWERGUARD), "check-resume", "--stop-at", "5", "--workdir", str(tmp_path), "--"]
    argv += [sys.executable, str(SCRIPT), *script_args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=tmp_path)


def test_a_script_that_fetches_ahead_is_caught_with_the_tensors_named(tmp_path):
    r = check(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    text = " ".join(r.stdout.split())
    assert "DIFFERS after the resume" in text and "model.weight:" in text and "model.bias:" in text
    assert "state fetched ahead" in text  # the usual cause, named
    assert "resumed at step 6 from the local tier's checkpoint of step 5" in (tmp_path / "resumed.log").read_text()


def test_the_fixed_script_resumes_exactly(tmp_path):
    r = check(tmp_path, "--fixed")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RESUMES EXACTLY" in r.stdout


def test_a_run_whose_parameters_never_change_is_not_called_exact(tmp_path):
    """Identical end states of a run that never trained prove nothing (the DDP tutorial's loss is
    identically 0): it passed as RESUMES EXACTLY."""
    r = check(tmp_path, "--fixed", "--frozen")
    assert r.returncode == 2, r.stdout + r.stderr
    text = " ".join(r.stdout.split())
    assert "NOT CHECKED" in text and "the run never changed them" in text and "RESUMES EXACTLY" not in text


def test_a_run_that_fails_is_reported_not_compared(tmp_path):
    r = subprocess.run(
        [
            str(POWERGUARD),
            "check-resume",
            "--stop-at",
            "3",
            "--workdir",
            str(tmp_path),
            "--",
            sys.executable,
            "-c",
            "raise SystemExit(3)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "NOT CHECKED" in r.stdout and "straight run exited 3" in r.stdout
