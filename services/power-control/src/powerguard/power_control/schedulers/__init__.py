"""Scheduler adapters: slurm, docker, process, command (and none)."""

from __future__ import annotations

from ..config import SchedulerSettings
from .base import NoScheduler, Scheduler

__all__ = ["Scheduler", "make_scheduler"]


def make_scheduler(settings: SchedulerSettings) -> Scheduler:
    if settings.kind == "slurm":
        from .slurm import SlurmScheduler

        return SlurmScheduler(settings.options)
    if settings.kind == "docker":
        from .docker import DockerScheduler

        return DockerScheduler(settings.options)
    if settings.kind == "process":
        from .process import ProcessScheduler

        return ProcessScheduler(settings.options)
    if settings.kind == "command":
        from .command import CommandScheduler

        return CommandScheduler(settings.options)
    return NoScheduler()
