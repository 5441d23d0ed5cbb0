"""What the training sims (``train``, Lightning, HF Trainer) share: the command line of a
simulated job and the rank's simulated node."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn


def job_parser(description: str, *, steps_help: str, local_dir_help: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, allow_abbrev=False)
    p.add_argument("--job", required=True, help="the job's name on the bus (its agent registrations and acks)")
    p.add_argument("--steps", type=int, default=100, help=steps_help)
    p.add_argument("--local-dir", required=True, help=local_dir_help)
    p.add_argument("--nats-url", help="the site's NATS (credential and CA from NATS_CREDS, NATS_CA); none: no bus")
    p.add_argument("--prefix", default="pg", help="subject prefix of the deployment (default pg)")
    p.add_argument("--stream", default="PG_EVENTS", help="the events stream (default PG_EVENTS)")
    p.add_argument("--agents-bucket", default="pg_agents", help="the agents' KV bucket (default pg_agents)")
    p.add_argument(
        "--sim-node",
        "--node",
        dest="node",
        default=os.environ.get("POWERGUARD_NODE"),
        help="the node every rank says it runs on (env POWERGUARD_NODE; --nodes spreads them instead)",
    )
    p.add_argument("--nodes", help="n1,n2: ranks are spread over these nodes in order (simulated multi-node)")
    p.add_argument("--seed", type=int, default=1234, help="data, weights and dropout seed (default 1234)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (to make room for requests)")
    p.add_argument("--agree-every-s", type=float, help="the agent's agree_every_s (default: the agent's)")
    p.add_argument("--hold-policy", choices=["checkpoint-at-stop", "pause", "continue"], help="override the site's")
    p.add_argument("--out", help="rank 0 writes the final parameters here (torch.save)")
    p.add_argument("--progress", help="each rank appends '<rank> <step> <unix time>' lines here")
    return p


def rank_node(args: argparse.Namespace) -> str | None:
    """This rank's node: from ``--nodes`` in rank order (simulated multi-node), else ``--node``."""
    if not args.nodes:
        return args.node
    nodes = args.nodes.split(",")
    return nodes[int(os.environ.get("RANK", 0)) * len(nodes) // int(os.environ.get("WORLD_SIZE", 1))]


def guard_options(args: argparse.Namespace) -> dict:
    """The PowerGuard callback's options from the command line (the bus, node, policy, pacing)."""
    from powerguard.bus import BusNames

    return {
        "job": args.job,
        "nats_url": args.nats_url,
        "names": BusNames(prefix=args.prefix, stream=args.stream, agents=args.agents_bucket),
        "node": rank_node(args),
        "hold_policy": args.hold_policy,
        **({"agree_every_s": args.agree_every_s} if args.agree_every_s is not None else {}),
    }


def exit_finished(code: int) -> NoReturn:
    """End a rank whose ``main`` returned (its groups destroyed, its files written) without the
    interpreter's finalization: a gloo group still referenced (a device mesh, DDP) keeps its
    worker threads, and one dropping a finished collective's work (it holds Python tensors)
    needs the GIL; during finalization that thread exits through a noexcept frame: std::terminate,
    the rank SIGABRTs after a run that succeeded (core dump of a test's rank in CI; the same
    race as pytorch/pytorch#179291). A failure (an exception, SystemExit) exits the usual way."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
