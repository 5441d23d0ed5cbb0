"""One root error class with precise subclasses; every message names the device."""

from __future__ import annotations

from powerguard.schemas import PowerGuardError


class PowerControlError(PowerGuardError):
    """Root of every power-control error."""

    retryable = True


class DeviceUnreachable(PowerControlError):
    """Nothing answered (connection refused, no route, timeout)."""


class AuthenticationFailed(PowerControlError):
    """The device refused our credentials, twice in a row on fresh sessions (drivers raise it
    for every refusal; the device's guard turns a first one into :class:`CredentialsDoubted`).
    Never retried automatically: a wrong password stays wrong, and hammering a BMC with it can
    lock the account."""

    retryable = False


class CredentialsDoubted(PowerControlError):
    """The device refused our credentials once: retried on a fresh session before it counts
    (a BMC under load drops and mixes up sessions; ``retry_policy.py``)."""


class CommandRejected(PowerControlError):
    """The device answered but refused the command (read-only community, unsupported action)."""

    retryable = False


class TlsUntrusted(PowerControlError):
    """The device's TLS certificate does not verify against the configured CA bundle."""

    retryable = False


class PowerStateTimeout(PowerControlError):
    """The device accepted the command but did not reach the wanted state in time."""


class SchedulerError(PowerControlError):
    """The scheduler adapter could not stop or start a job."""


class KubeApiError(SchedulerError):
    """The Kubernetes API refused a request: ``code`` is its HTTP status (409 a conflict, 404
    not found, 403 forbidden, 422 invalid: a failed ``test`` of a JSON patch)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class CredentialUnavailable(PowerControlError):
    """A device's credential reference (env var or file) cannot be resolved: retrying won't help."""

    retryable = False
