"""The sample training job with crash points, for crash tests only: the ckpt-agent carries no
failpoint of its own. Run as ``torchrun -m tests.integration.ckpt.failpoints <train args>``.

``POWERGUARD_TEST_FAILPOINT``:
  ``before_commit``     rank 0 dies (SIGKILL) with every file written, just before COMMIT
  ``final_checkpoint``  the rank in ``POWERGUARD_TEST_FAILPOINT_RANK`` dies as a final
                        (checkpoint-at-stop) checkpoint starts, once every rank knows of it
  ``replica_zeros``     on the node in ``POWERGUARD_TEST_FAILPOINT_NODE``, the replication
                        cannot read the node's files (each is sent as zeros, as an unreadable
                        file is); the commit and the restore read them as usual
  ``own_files_only``    every rank's restore plan reads its own data files only, as at scale
                        (DCP stores each replicated item once, spread over the ranks: with more
                        ranks than such items most ranks' files hold none), so before its
                        commit no node is sent another node's files
"""

from __future__ import annotations

import logging
import os
import signal

from powerguard.ckpt_agent import _layout, _ranks

log = logging.getLogger("powerguard.ckpt_agent.failpoints")


def _die(what: str) -> None:
    log.warning("failpoint %s: killing this process", what)
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: str | None, rank: str | None) -> None:
    if point == "before_commit":

        def write_commit(*args, **kwargs):
            _die("before_commit")

        _layout.write_commit = write_commit
    elif point == "final_checkpoint":
        real = _ranks.Ranks.gather  # every gather of the agent's own group

        def gather(self, obj):
            out = real(self, obj)
            finals = [d for rs in out if isinstance(rs, list) for d, *_ in rs if getattr(d, "reason", None) == "final"]
            if finals and str(self.rank) == rank:
                _die(f"final_checkpoint (rank {self.rank})")
            return out

        _ranks.Ranks.gather = gather
    elif point == "replica_zeros":
        import threading

        import torch

        from powerguard.ckpt_agent import _nodes

        real_read = _nodes._read

        def _read(path, off, n):
            replicating = threading.current_thread().name == "pg-ckpt-replicate"
            if replicating and os.environ.get("POWERGUARD_NODE") == os.environ.get("POWERGUARD_TEST_FAILPOINT_NODE"):
                return torch.zeros(n, dtype=torch.uint8)
            return real_read(path, off, n)

        _nodes._read = _read
    elif point == "own_files_only":
        from powerguard.ckpt_agent import _node_exchange

        def needed_files(self, directory):
            return {n for n in os.listdir(directory) if n.startswith(f"__{self.rank}_") and n.endswith(".distcp")}

        _node_exchange.NodeExchange.needed_files = needed_files
    elif point:
        raise SystemExit(f"unknown POWERGUARD_TEST_FAILPOINT {point!r}")


if __name__ == "__main__":
    import runpy

    install(os.environ.get("POWERGUARD_TEST_FAILPOINT"), os.environ.get("POWERGUARD_TEST_FAILPOINT_RANK"))
    runpy.run_module("powerguard.sim.train", run_name="__main__", alter_sys=True)
