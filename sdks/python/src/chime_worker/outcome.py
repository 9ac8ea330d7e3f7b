"""The pure mapping from how a handler ended to the states the worker records (step 6)."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import Cancel, Fail, JobError, Retry


@dataclass
class Execution:
    """How one handler invocation ended, as the worker observed it."""

    #: None: returned normally; a JobError; another exception; or "abandoned".
    error: BaseException | str | None
    timed_out_ms: int | None = None
    interrupted: bool = False
    cancel_requested: bool = False


@dataclass(frozen=True)
class Outcome:
    """What the worker records before the retry decision: `run` is `succeeded`, `failed`,
    `cancelled` or `retryable` (then the database's retry decision says retrying or dead)."""

    attempt_state: str
    run: str
    error: str | None
    retry_after_ms: int | None = None


def _fmt_ms(ms: int) -> str:
    return f"{ms / 1000:g}s" if ms % 1000 == 0 or ms >= 1000 else f"{ms}ms"


def describe(error: BaseException | str, cancel_grace_ms: int) -> str:
    if error == "abandoned" or not isinstance(error, BaseException):
        return (f"handler did not stop within {_fmt_ms(cancel_grace_ms)} of its cancellation "
                "and was abandoned")
    if isinstance(error, JobError):
        return f"handler returned: {error.message}"
    return f"handler raised: {type(error).__name__}: {error}"


def outcome(execution: Execution, cancel_grace_ms: int) -> Outcome:
    e = execution.error
    if e is None:
        # Finishing successfully wins, even after a cancellation fired.
        return Outcome("succeeded", "succeeded", None)
    if execution.cancel_requested:
        return Outcome("cancelled", "cancelled",
                       f"cancelled by an operator; {describe(e, cancel_grace_ms)}")
    if execution.timed_out_ms is not None:
        after = e.after_ms if isinstance(e, Retry) else None
        return Outcome("timed_out", "retryable",
                       f"timed out after {_fmt_ms(execution.timed_out_ms)}; "
                       f"{describe(e, cancel_grace_ms)}", after)
    if execution.interrupted and (isinstance(e, Cancel) or e == "abandoned"):
        return Outcome("cancelled", "retryable",
                       f"interrupted by worker shutdown; {describe(e, cancel_grace_ms)}")
    if e == "abandoned":
        return Outcome("cancelled", "retryable", f"interrupted; {describe(e, cancel_grace_ms)}")
    if isinstance(e, Retry):
        return Outcome("failed", "retryable", e.message, e.after_ms)
    if isinstance(e, Fail):
        return Outcome("failed", "failed", e.message)
    if isinstance(e, Cancel):
        return Outcome("cancelled", "cancelled", e.message)
    assert isinstance(e, BaseException)
    return Outcome("failed", "retryable", f"handler raised: {type(e).__name__}: {e}")
