"""What a handler raises when it does not succeed: `Retry`, `Fail` or `Cancel`.

| raised | attempt | run |
|---|---|---|
| `Retry(msg, after=...)`, or any other exception | `failed` | `retrying` while attempts remain, else `dead` |
| `Fail(msg)` | `failed` | `failed`, never retried |
| `Cancel(msg)` | `cancelled` | `cancelled` |
"""

from __future__ import annotations

from datetime import timedelta


class JobError(Exception):
    """Base of the handler verdicts; `message` is stored as the attempt's error."""

    kind = "job-error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __eq__(self, other: object) -> bool:
        return (type(self) is type(other) and isinstance(other, JobError)
                and self.message == other.message
                and getattr(self, "after", None) == getattr(other, "after", None))

    def __hash__(self) -> int:
        return hash((type(self), self.message))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class Retry(JobError):
    """A failure worth another attempt, optionally not before `after` (seconds or timedelta)."""

    kind = "retry"

    def __init__(self, message: str, after: float | timedelta | None = None) -> None:
        super().__init__(message)
        if isinstance(after, timedelta):
            after = after.total_seconds()
        if after is not None and not (0 <= after < float("inf")):
            raise ValueError(f"Retry(after={after!r}): after must be a finite number of "
                             "seconds >= 0")
        self.after: float | None = after

    @property
    def after_ms(self) -> int | None:
        return None if self.after is None else int(round(self.after * 1000))

    def __repr__(self) -> str:
        return f"Retry({self.message!r}, after={self.after!r})"


class Fail(JobError):
    """A failure another attempt would not fix (bad input, a business rule): no retry."""

    kind = "fail"


class Cancel(JobError):
    """The handler gave up on purpose; the run ends `cancelled`."""

    kind = "cancel"


class ConfigError(ValueError):
    """A setting is out of its bounds; the message names the setting, the value and the fix."""
