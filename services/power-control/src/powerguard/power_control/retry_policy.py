"""When a failed device request is tried again, and when a refused credential is believed
(pure: errors, counts and a clock in, decisions out; nothing here sleeps or reads a device).

A BMC that answers "RAKP 2 HMAC is invalid" has not always refused our password: under load a
BMC with few session slots drops or mixes up sessions, and two sessions of one node at once
(an off and an on overlapping) confuse some. So a refusal is *doubted* the first time
(:class:`~.errors.CredentialsDoubted`, retryable: tried again on a fresh session after
``confirm_s``) and *declared* (:class:`~.errors.AuthenticationFailed`, never retried, the device
held off for ``holdoff_s`` so a wrong password cannot lock the BMC's account) only when the
fresh session is refused too. Any answer in between clears the doubt.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CredentialsDoubted, PowerControlError


@dataclass(frozen=True)
class Retry:
    again: bool
    delay_s: float = 0.0


def after_failure(error: PowerControlError, attempt: int, *, retries: int, backoff_s: float, confirm_s: float) -> Retry:
    """What to do after ``attempt`` (0-based) of a request failed with ``error``: a doubted
    credential is tried again after ``confirm_s`` (a fresh session soon, not a long backoff),
    even past ``retries``: only a second refusal may declare it; another retryable error after
    ``backoff_s`` doubling, at most ``retries`` times; nothing for an error that retrying cannot
    fix (a declared credential refusal, a rejected command, an untrusted certificate)."""
    if isinstance(error, CredentialsDoubted):
        return Retry(True, confirm_s)
    if not error.retryable or attempt >= retries:
        return Retry(False)
    return Retry(True, backoff_s * 2**attempt)


@dataclass
class CredentialWatch:
    """One device's refusals of our credentials: doubted once, declared when a fresh session is
    refused again, then held off (requests fail fast) for ``holdoff_s``."""

    holdoff_s: float
    refusals: int = 0  # in a row, without an answer between them
    declared: tuple[float, str] | None = None  # (when, why)

    def blocked(self, now: float) -> str | None:
        """Why requests must fail fast now (a declared refusal within the hold-off), or None."""
        if self.declared is None:
            return None
        at, why = self.declared
        if now - at < self.holdoff_s:
            return why
        self.declared, self.refusals = None, 0
        return None

    def refused(self, now: float, why: str) -> bool:
        """The device refused the credentials; True when that is now believed (declared)."""
        self.refusals += 1
        if self.refusals >= 2:
            self.declared = (now, why)
            return True
        return False

    def answered(self) -> None:
        """The device answered a request (whatever it said): the credentials work."""
        self.refusals = 0
