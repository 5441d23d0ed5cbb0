"""One rank of the pause-and-SIGTERM test (torchrun, gloo on CPU). Every rank installs a SIGTERM
handler that broadcasts on the default group, as Lightning 2.6's does, then pauses (the agent's
``Hold``). Rank 1 polls the pause at once, so it waits in the pause's collective for rank 0;
rank 0 polls nothing: once rank 1 said it is polling, rank 0 writes ``<out>/ready`` and waits for
the stop. The test then sends SIGTERM to torchrun, which forwards it to both ranks. Each rank
writes ``<out>/rank<N>.exit`` with how it left the pause."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from powerguard.ckpt_agent._hold import Hold
from powerguard.ckpt_agent._ranks import Ranks


def frameworks_handler(signum, frame) -> None:
    """What Lightning 2.6's SIGTERM notifier does: a broadcast on the default group."""
    dist.broadcast(torch.tensor([1]), src=0)


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    signal.signal(signal.SIGTERM, frameworks_handler)
    never_released = SimpleNamespace(released=lambda sagas: False, pending=lambda: None)
    hold = Hold(never_released, Ranks(), poll_s=0.05)
    pause = hold.begin(5, [])
    try:
        if rank == 1:
            store.set("polling", "1")
            while True:
                hold.poll(pause)
                hold.wait(pause)
        store.wait(["polling"])
        time.sleep(0.5)  # rank 1 is in the pause's collective by now, waiting for this rank
        (out / "ready").write_text("1")
        while not pause.stopped.is_set():
            hold.wait(pause)
        hold.poll(pause)
    except SystemExit as exc:
        (out / f"rank{rank}.exit").write_text(str(exc.code))
        raise


if __name__ == "__main__":
    main()
