"""Run a handler in a unit test: no broker, no database.

    from chime_worker.testing import run_handler

    result = await run_handler(greet, {"name": "Ada"})
    assert result.outcome.run == "succeeded"
    assert result.logs == [("info", "hello, Ada (run 1)")]

The handler gets a real `Context` (params decoded as the worker decodes them, a logger, a
cancellation event) and the test gets the outcome the worker would record and the log lines.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from .context import Context, JobLogger
from .errors import Fail
from .outcome import Execution, Outcome, outcome
from .worker import Handler, decode_params


@dataclass(frozen=True)
class TestRun:
    """What a test run produced."""

    __test__ = False  # not a pytest test class

    #: None when the handler returned; else what it raised (a JobError or any exception).
    error: BaseException | None
    #: The attempt and run states the worker would record (`run` is `retryable` for a failure
    #: the retry policy decides on).
    outcome: Outcome
    #: The lines the handler logged, in order: (level, message).
    logs: list[tuple[str, str]]

    @property
    def ok(self) -> bool:
        return self.error is None


async def run_handler(
    handler: Handler,
    params: Any = None,
    *,
    job: str = "test-job",
    run_id: int = 1,
    attempt: int = 1,
    scheduled_at: datetime | None = None,
    params_type: type | None = None,
    timeout: float | None = None,
    cancel: Callable[[asyncio.Event], None] | None = None,
) -> TestRun:
    """Runs `handler` once and returns its outcome and log lines. `cancel`, if given, is
    called with the cancellation event (set it to test a handler's cancel path); `timeout`
    (seconds) fires it like the job's timeout would."""
    logger = JobLogger(run_id, attempt)
    logger.keep_all = True
    cancelled = asyncio.Event()
    ctx = Context(run_id=run_id, job=job, attempt=attempt,
                  scheduled_at=scheduled_at or datetime.now(timezone.utc), params=params,
                  log=logger, cancelled=cancelled,
                  timeout_ms=None if timeout is None else int(timeout * 1000))
    if cancel is not None:
        cancel(cancelled)
    error: BaseException | None = None
    timed_out: int | None = None
    try:
        decoded = decode_params(params, params_type, job)
        if timeout is None:
            await handler(ctx, decoded)
        else:
            task = asyncio.ensure_future(handler(ctx, decoded))
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                timed_out = int(timeout * 1000)
                cancelled.set()
                await task
            else:
                task.result()
    except Fail as e:
        error = e
    except Exception as e:
        error = e
    result = outcome(Execution(error, timed_out_ms=timed_out,
                               cancel_requested=cancel is not None), 5000)
    return TestRun(error, result, [(line.level, line.message) for line in logger.lines])
