"""Error hierarchy shared by every PowerGuard package.

One root (:class:`PowerGuardError`) with precise subclasses, so callers can catch
exactly what they can handle.
"""

from __future__ import annotations


class PowerGuardError(Exception):
    """Root of every error PowerGuard raises on purpose."""


class EventError(PowerGuardError):
    """An event could not be decoded or encoded."""


class MalformedEvent(EventError):
    """The payload is not a valid event (bad JSON, missing or wrong fields)."""


class UnknownEventType(EventError):
    """The envelope names a ``type`` that no model is registered for."""

    def __init__(self, type_: str) -> None:
        super().__init__(f"unknown event type {type_!r}")
        self.type = type_


class UnsupportedVersion(UnknownEventType):
    """The ``type`` is a PowerGuard type, but of a version this build does not speak."""

    def __init__(self, type_: str, supported: list[str]) -> None:
        EventError.__init__(self, f"unsupported event version {type_!r}; this build speaks {', '.join(supported)}")
        self.type = type_
        self.supported = supported


class PayloadTooLarge(EventError):
    """The payload exceeds the configured maximum size."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class SubjectMismatch(EventError):
    """A valid event arrived on a subject its data does not name (a type or job that does not
    belong there): never handed to a handler."""

    def __init__(self, type_: str, subject: str, expected: str) -> None:
        super().__init__(f"{type_} does not belong on {subject} (its subject is {expected})")
        self.type, self.subject, self.expected = type_, subject, expected


class StampedInTheFuture(EventError):
    """An event whose ``time`` lies further ahead of the receiver's clock than the clock skew it
    allows: a reading from the future would make every true one look old."""

    def __init__(self, type_: str, ahead_s: float, limit_s: float) -> None:
        super().__init__(f"{type_} is stamped {ahead_s:.0f}s in the future (more than the {limit_s:.0f}s clock skew)")
        self.type, self.ahead_s, self.limit_s = type_, ahead_s, limit_s


class IdentityMismatch(EventError):
    """A record names a party other than the one its key (or subject) is bound to: the server
    lets a job's agent write only under ``<job>.*``, so what the record says inside must agree."""

    def __init__(self, what: str, key: str, expected: str, claimed: str) -> None:
        super().__init__(f"{what} under key {key} claims {claimed} (its key says {expected})")
        self.key, self.expected, self.claimed = key, expected, claimed


class InvalidSubjectToken(PowerGuardError, ValueError):
    """A name used in a NATS subject (site, ups, job, node, ...) is not a valid token."""


class ConfigError(PowerGuardError):
    """A configuration file or value is invalid."""


class SecretNotFound(ConfigError):
    """A credential reference (env var or file) could not be resolved."""
