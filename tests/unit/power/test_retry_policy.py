"""The retry policy of a failed device request and the credential watch, each rule on its own
(pure: no device, no clock)."""

from __future__ import annotations

from powerguard.power_control.errors import (
    AuthenticationFailed,
    CommandRejected,
    CredentialsDoubted,
    DeviceUnreachable,
)
from powerguard.power_control.retry_policy import CredentialWatch, Retry, after_failure

POLICY = {"retries": 3, "backoff_s": 2.0, "confirm_s": 1.0}


def test_a_retryable_error_backs_off_doubling_up_to_the_retries():
    err = DeviceUnreachable("bmc:n1: no answer")
    assert [after_failure(err, a, **POLICY) for a in range(4)] == [
        Retry(True, 2.0),
        Retry(True, 4.0),
        Retry(True, 8.0),
        Retry(False),
    ]


def test_a_doubted_refusal_is_tried_again_soon_even_past_the_retries():
    err = CredentialsDoubted("bmc:n1: BMC refused the credentials (RAKP 2 HMAC is invalid) once")
    assert after_failure(err, 0, **POLICY) == Retry(True, 1.0)
    assert after_failure(err, 0, **{**POLICY, "retries": 0}) == Retry(True, 1.0)


def test_a_declared_refusal_and_a_rejected_command_are_never_retried():
    assert after_failure(AuthenticationFailed("bmc:n1: refused"), 0, **POLICY) == Retry(False)
    assert after_failure(CommandRejected("bmc:n1: not supported"), 0, **POLICY) == Retry(False)


def test_one_refusal_is_doubted_a_second_in_a_row_is_declared_and_held_off():
    watch = CredentialWatch(holdoff_s=300)
    assert watch.refused(0.0, "RAKP 2 HMAC is invalid") is False and watch.blocked(0.0) is None
    assert watch.refused(1.0, "RAKP 2 HMAC is invalid") is True
    assert watch.blocked(2.0) == "RAKP 2 HMAC is invalid" and watch.blocked(300.9) is not None
    assert watch.blocked(301.0) is None  # the hold-off is over: the next request may try


def test_an_answer_between_two_refusals_clears_the_doubt():
    watch = CredentialWatch(holdoff_s=300)
    watch.refused(0.0, "RAKP 2 HMAC is invalid")
    watch.answered()
    assert watch.refused(5.0, "RAKP 2 HMAC is invalid") is False and watch.blocked(5.0) is None
