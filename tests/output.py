"""What a command's normal output must not hold: a Python traceback, or asyncio's report of a
task whose exception nobody read (it prints one, and reads like a crash in the report a user
reads)."""

from __future__ import annotations

NOISE = (
    "Traceback (most recent call last)",
    "Task exception was never retrieved",
    "Task was destroyed but it is pending",
)


def quiet(output: str) -> None:
    found = [n for n in NOISE if n in output]
    assert not found, f"{found[0]!r} in the command's output:\n{output[-4000:]}"
