"""``python -m powerguard.ckpt_agent verify DIR...``: what a restore would trust, and why.

The ckpt-agent is a library inside every training rank, not a service: there is no process
to run beside the job. This command checks checkpoint directories offline (a local path or an
fsspec URL: ``file:///nas/ckpt/job/step-100``, ``s3://...``): COMMIT, every manifest against
it, every file's size and xxh3 checksum, the DCP ``.metadata`` digest, file names confined to
the directory. Exit status 0 when every directory verifies, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ._keys import load_job_keys
from .errors import CheckpointError, CorruptCheckpoint
from .verify import placed, verify_checkpoint


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m powerguard.ckpt_agent", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="verify checkpoint directories as a restore would")
    v.add_argument("dirs", nargs="+", metavar="DIR", help="a step directory (path or fsspec URL)")
    v.add_argument("--json", action="store_true", help="one JSON object per directory")
    v.add_argument(
        "--key-file",
        default=os.environ.get("POWERGUARD_CKPT_KEY_FILE"),
        help="the site's checkpoint key, or a job's (`powerguard ckpt-key issue`): also require the job's "
        "signature (default: $POWERGUARD_CKPT_KEY_FILE)",
    )
    args = p.parse_args(argv)
    key = None
    bad = 0
    for d in args.dirs:
        try:
            keys = load_job_keys(args.key_file, placed(d)[0] or "") if args.key_file else None
        except CheckpointError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        key = keys
        try:
            commit = verify_checkpoint(d, keys=keys)
            result = {
                "dir": d,
                "trusted": True,
                "step": commit.get("step"),
                "world_size": commit.get("world_size"),
                "reason": f"COMMIT, {len(commit.get('manifests', {}))} manifest(s), every file and .metadata verified"
                + (f" and signed with job {commit.get('job')!r}'s key" if key else ""),
            }
        except (CorruptCheckpoint, OSError, KeyError, ValueError) as exc:
            bad += 1
            result = {"dir": d, "trusted": False, "reason": f"{type(exc).__name__}: {exc}"}
        if args.json:
            print(json.dumps(result))
        elif result["trusted"]:
            print(f"OK   {d}: step {result['step']}, {result['world_size']} rank(s) - {result['reason']}")
        else:
            print(f"BAD  {d}: {result['reason']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
