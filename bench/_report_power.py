"""docs/performance.md's section on the power checkpoint against the disk (bench/power_checkpoint.py)."""

from __future__ import annotations

PROFILE = """
**Where the time of a power checkpoint goes** (cProfile of `CheckpointAgent.save`, 1 rank, 1 GB of
model + AdamW state on this machine's disk, before the change): 3.09 s in all, of which 2.41 s in
the `write` calls of DCP's single writer thread (the kernel taking one stream's dirty pages at
the disk's writeback pace), 0.34 s in the 8 fsyncs, 0.04 s hashing (xxh3, inline), 4 ms
building the state dict, under 10 ms planning and collectives, 2 ms manifest and `COMMIT`. The
time is the disk's, reached through one stream: DCP's default `thread_count=1`. With 4 ranks per
node each rank writes a quarter through its own stream, and the agreement and gathers add a few
ms. The restore, 1 GB cold: 0.56 s verifying (4 files read by 4 threads) then 0.87 s loading
(DCP reading the now cached files one after the other: 0.65 s in `readinto`).

**What changed**: the synchronous save writes through parallel writers, DCP's `thread_count`,
chosen by the agent: 4 per rank, and no file under 64 MiB (`_writers.writer_threads`;
`writer_threads=` overrides; a first rule, a budget of 4 per node shared by its ranks, left the
4-rank case at 0.61 of the best plain DCP, which was 4 per rank); each thread writes its
own file and fsyncs it once, then the manifest, `COMMIT` and the directory fsyncs as before
(the power-cut campaign's checks are unchanged). The restore verifies several files at once and
loads the files in parallel, one reader thread per file (`SafeFileSystemReader(threads=)`).
Hashing stays inline: it is 1-2 % of the time.

**What is left**: at 1 GB the power checkpoint reaches 0.81-0.82 of the best plain `dcp.save`
(target 0.9): the rest is the agent's own work per checkpoint (directory preparation with its
fsyncs, the gathers of two small collectives, per-rank manifests, `COMMIT` and the directory
fsyncs, inline hashing) on a 0.6 s save; a fixed cost, so the ratio grows with the state (4 GB,
1 rank: 0.97; 4 ranks: 0.84). The restore reaches 0.52-0.62 of `dd` reading the same files with
1 rank and 0.76-0.95 with 4 (target 0.8): it reads each file twice, once cold to verify it and
once from the page cache to load it. Loading
a file while the next one is verified would overlap them, but a corrupt file found after others
were loaded leaves a half-overwritten state, so it was not done. Reading each file once into
memory and verifying it before use was tried and was slower here: fresh memory costs as much as
the read on this VM (0.2 s per 256 MB), on top of `torch.load`'s own buffers.
"""


HEADER = (
    "| ranks/node | GB | dd | DCP default | best DCP (threads) | power ckpt | / best DCP | / dd "
    "| request → durable p50 | restore | dd read | restore / dd read |\n" + "|---" * 12 + "|"
)


def power_section(pc: dict | None) -> str:
    if not pc or not pc.get("runs"):
        return ""
    rows = []
    for r in pc["runs"]:
        g = r["gb_s"]
        best = r["best_dcp_threads"]
        best_gb_s = g["dcp_default"] if best == 1 else g[f"dcp_threads_{best}"]
        rows.append(
            f"| {r['ranks_per_node']} | {r['state_gb']:.2f} | {g['dd']} | {g['dcp_default']} | {best_gb_s} "
            f"({best}) | **{g['power_checkpoint']}** | **{r['over_best_dcp']}** | **{r['over_dd']}** | "
            f"{r['request_to_every_rank_durable_p50_s']} s | {g['restore']} | {g['dd_read']} | "
            f"**{r['restore_over_dd_read']}** |"
        )
    cold = all(r.get("cold_reads") for r in pc["runs"])
    return f"""
## The power checkpoint against the disk (`bench/power_checkpoint.py`)

One run per row, the same state (FSDP2 model + AdamW, sharded over the ranks of one node) and
disk, alternated repetitions, medians ({", ".join(sorted({str(r["reps"]) for r in pc["runs"]}))} reps: see
each run's `reps`); GB/s. The power checkpoint's
time is the slowest rank's save from the agreed step to `COMMIT` (its ack says it); "request →
durable" adds the paced step agreement (`agree_every_s` 0.5 s: up to ~1 s) and the acks. Reads
{"cold (page cache dropped)" if cold else "WARM (the page cache could not be dropped: not root)"}.
Targets: power checkpoint / best plain DCP ≥ 0.9, / `dd conv=fsync` ≥ 0.8; restore / `dd` read ≥ 0.8.

{HEADER}
{chr(10).join(rows)}

`dd` here reads `/dev/zero` and writes 16 MiB blocks: two copies per block on this VM, which
makes it slower than a program writing from memory (DCP, the agent); the ratio over `dd` is the
issue's anchor, the ratio over the best plain DCP is the comparison that holds on any disk.
{PROFILE}"""
