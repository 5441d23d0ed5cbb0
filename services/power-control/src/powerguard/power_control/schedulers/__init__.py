"""Scheduler adapters: slurm, docker, process, command, kubernetes (and none)."""

from __future__ import annotations

from pydantic import ValidationError

from powerguard.schemas import ConfigError

from ..config import SchedulerSettings
from .base import NoScheduler, Scheduler

__all__ = ["Scheduler", "make_scheduler"]


def make_scheduler(settings: SchedulerSettings) -> Scheduler:
    """The job adapter of ``power_control.scheduler``; :class:`ConfigError` names each bad option
    (``power_control.scheduler.options.jobs.train.argv: Field required``), never a raw
    validation error."""
    try:
        return _make(settings)
    except ValidationError as exc:
        where = "power_control.scheduler.options"
        problems = "; ".join(f"{where}.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        raise ConfigError(f"{settings.kind} job adapter: {problems}") from None


def _make(settings: SchedulerSettings) -> Scheduler:
    if settings.kind == "slurm":
        from .slurm import SlurmScheduler

        return SlurmScheduler(settings.options)
    if settings.kind == "docker":
        from .docker import DockerScheduler

        return DockerScheduler(settings.options)
    if settings.kind == "process":
        from .process import ProcessScheduler

        return ProcessScheduler(settings.options)
    if settings.kind == "kubernetes":
        from .kubernetes import KubernetesScheduler

        return KubernetesScheduler(settings.options)
    if settings.kind == "command":
        from .command import CommandScheduler

        return CommandScheduler(settings.options)
    return NoScheduler()
