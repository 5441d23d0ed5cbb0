"""Bus errors: one root, precise subclasses."""

from __future__ import annotations

from powerguard.schemas.errors import PowerGuardError


class BusError(PowerGuardError):
    """Root of every error raised by :mod:`powerguard.bus`."""


class ConnectError(BusError):
    """The NATS server could not be reached or refused us."""


class SetupError(BusError):
    """The stream or a KV bucket could not be created or updated. ``transient``: the servers did
    not answer in time (worth trying again), as opposed to a refusal."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class PublishError(BusError):
    """An event was not stored by JetStream (no ack within the timeout)."""


class ReadError(BusError):
    """A stored event could not be read (no answer, or the server refused the read)."""


class CasConflict(BusError):
    """A KV update named a revision that is no longer the latest."""

    def __init__(self, bucket: str, key: str, revision: int | None) -> None:
        super().__init__(f"{bucket}/{key}: revision {revision} is stale (someone else wrote first)")
        self.bucket = bucket
        self.key = key
        self.revision = revision


class RegistrationRefused(BusError):
    """The agent registry did not take a rank's record (its bucket full, or a write the credential
    may not make); the rank's registration went out as an event on its job's own subject instead."""

    def __init__(self, key: str, cause: BaseException) -> None:
        super().__init__(f"registry record {key} refused: {type(cause).__name__}: {cause}")
        self.key = key
        self.cause = cause


class EmbeddedServerError(BusError):
    """The embedded nats-server could not be started."""
