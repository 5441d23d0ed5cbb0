"""``powerguard try -- <command>``: a user's own command drilled through a simulated outage.

The commands are run as a user would run them, unchanged: the simulated job module with its
own job name and checkpoint directory (FSDP2 and tensor parallel on node-local disks), and a
single-process script that draws its next batch ahead. The drill starts the real services
and site around them; the verdict compares every tensor with an uninterrupted run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.output import quiet

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

POWERGUARD = Path(sys.executable).parent / "powerguard"
AHEAD = Path(__file__).parents[1] / "integration" / "resume_scripts" / "fetch_ahead.py"


def try_(tmp_path: Path, *command: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    argv = [str(POWERGUARD), "try", "--workdir", str(tmp_path / "try"), "--json", str(report), "--", *command]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert report.exists(), r.stdout[-4000:] + r.stderr[-3000:]
    return r, json.loads(report.read_text())


def sim_job(tmp_path: Path, *flags: str) -> list[str]:
    """The simulated training job as a user's torchrun command: its own job name and directory."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        "-m",
        "powerguard.sim.train",
        "--job",
        "the-scripts-own-name",
        "--steps",
        "400",
        "--seed",
        "7",
        "--local-dir",
        str(tmp_path / "where-the-script-saves"),
        *flags,
    ]


def assert_survived(r: subprocess.CompletedProcess, report: dict) -> None:
    text = " ".join(r.stdout.split())
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    quiet(r.stdout + r.stderr)
    assert "DRILL OK" in text
    assert report["saga_states"][-3:] == ["restoring", "resumed", "done"]
    assert report["nodes_powered_off"] == 2  # the job really went down with its nodes
    assert report["restored_step"] is not None and report["restored_step"] > report["step_at_detection"]
    assert report["work"]["lost_steps"] == 0
    assert any(f"from the local tier's checkpoint of step {report['restored_step']}" in s for s in report["said"])
    assert report["bit_exact"] is True and report["differs"] == []
    assert report["final_step"] == {"reference": 399, "drill": 399}
    assert report["job"] == "try" and report["world"] == 4


def test_an_fsdp2_job_on_node_local_disks_survives_the_outage_bit_exact(tmp_path):
    r, report = try_(tmp_path, *sim_job(tmp_path, "--shard", "fsdp", "--local-scope", "node"))
    assert_survived(r, report)
    # each simulated node kept its own checkpoints; the script's directory was never written
    drill = tmp_path / "try" / "drill"
    assert sorted(p.name for p in drill.iterdir()) == ["node1", "node2"]
    assert not (tmp_path / "where-the-script-saves").exists()


@pytest.mark.full(reason="CI: the FSDP2 drill above; TP's resume in tests/integration/ckpt/test_sharded.py")
def test_a_tensor_parallel_job_on_node_local_disks_survives_the_outage_bit_exact(tmp_path):
    r, report = try_(tmp_path, *sim_job(tmp_path, "--shard", "tp", "--local-scope", "node"))
    assert_survived(r, report)
    # each node's shards on its own disk, then on its peer's: the second ack says replicated:1
    durability = report["durability"].values()
    assert durability and all(set(d) <= {"local", "replicated:1"} for d in durability), report["durability"]
    assert any("replicated:1" in d for d in durability), report["durability"]


@pytest.mark.full(reason="CI: tests/integration/test_resume_check.py catches the same script, tensors named")
def test_a_script_that_fetches_ahead_is_caught_after_the_outage_with_the_tensors_named(tmp_path):
    r, report = try_(tmp_path, sys.executable, str(AHEAD), "--steps", "300")
    assert r.returncode == 1, r.stdout[-4000:] + r.stderr[-3000:]
    assert report["world"] == 1 and report["restored_step"] is not None
    assert report["bit_exact"] is False
    assert {k for k, _ in report["differs"]} >= {"model.weight", "model.bias"}
    assert any("state fetched ahead" in c for c in report["causes"])
    assert "DIFFERS" in " ".join(r.stdout.split())


def test_a_job_too_short_for_the_outage_is_refused_naming_the_fix(tmp_path):
    r = subprocess.run(
        [str(POWERGUARD), "try", "--workdir", str(tmp_path / "try"), "--", sys.executable, str(AHEAD)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    text = " ".join(r.stdout.split())
    assert r.returncode == 2 and "DRILL NOT RUN" in text and "trains 12 steps" in text, text


@pytest.mark.parametrize(
    "module",
    [
        # Lightning's callback shares the HF one's paths (the framework saves, the try mode)
        pytest.param(
            "powerguard.sim.train_lightning",
            marks=pytest.mark.full(reason="CI: the Trainer's drill below; Lightning in tests/integration/ckpt"),
        ),
        "powerguard.sim.train_hf",
    ],
)
def test_lightning_and_hf_trainer_jobs_survive_the_outage(tmp_path, module):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", module]
    command += ["--job", "mine", "--steps", "400", "--seed", "7", "--local-dir", str(tmp_path / "theirs")]
    r, report = try_(tmp_path, *command)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert report["world"] == 2 and report["work"]["lost_steps"] == 0 and report["bit_exact"] is True
    assert report["saga_states"][-3:] == ["restoring", "resumed", "done"]
    # the framework's callback says where it started, both times (fresh, then the restored step)
    assert "fresh start at step 0" in report["said"][0]
    assert f"checkpoint of step {report['restored_step']}" in report["said"][-1]
    # the framework wrote into the drill's directory only (the Trainer may create its output_dir, empty)
    assert [p for p in (tmp_path / "theirs").rglob("*") if not p.is_dir()] == []
