"""The benchmarks' multi-rank runs: a script that is its own worker, launched under torchrun on
this machine's loopback; rank 0 writes its figures as JSON to ``--out``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TORCHRUN = Path(sys.executable).parent / "torchrun"


def parser(doc: str) -> argparse.ArgumentParser:
    """The benchmark's parser, with the worker's own (hidden) options: --worker, --dir."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    return p


def workers(script: str, ranks: int, *args: str) -> dict:
    """Run ``script --worker ARGS`` on ``ranks`` local ranks (a checkpoint directory of its own,
    one thread per rank); what rank 0 wrote to ``--out``."""
    with tempfile.TemporaryDirectory(prefix="pg-bench-") as tmp:
        out = Path(tmp) / "r.json"
        launch = [str(TORCHRUN), "--standalone", f"--nproc-per-node={ranks}", script]
        run = subprocess.run(
            [*launch, "--worker", f"--dir={tmp}/ckpt", *args, f"--out={out}"],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if run.returncode != 0:  # the ranks' own words: which rank failed, and why
            raise RuntimeError(f"{' '.join(launch)} {' '.join(args)}: exit {run.returncode}\n{run.stderr[-4000:]}")
        return json.loads(out.read_text())
