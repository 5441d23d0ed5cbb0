"""The power-cut tests: the filesystem (:mod:`powerguard.sim.powercut_fs`) and its mount
(:class:`powerguard.sim.powercut.PowerCutFs`) live in the simulated site, which
``powerguard demo --blackout`` uses too; the campaigns and the fixtures live here."""

from powerguard.sim.powercut import PowerCutFs, unavailable

__all__ = ["PowerCutFs", "unavailable"]
