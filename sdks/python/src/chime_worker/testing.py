"""Run a handler in a unit test: no broker, no database.

    from chime_worker.testing import run_handler

    result = await run_handler(greet, {"name": "Ada"})
    assert result.outcome.run == "succeeded"
    assert result.logs == [("info", "hello, Ada (run 1)")]

The handler gets a real `Context` (params decoded as the worker decodes them, a logger, a
cancellation event) and the test gets the outcome the worker would record and the log lines.

A task of a broadcast, sharded or map/reduce job: pass `task=Task(...)` (or `shard=Shard(...)`
for a sharded job's shard); `ctx.map` and `ctx.set_output` are recorded (`result.maps`,
`result.output`) with the worker's checks, and `ctx.results()` yields `results=[...]`:

    result = await run_handler(split, {"day": "2026-12-01"}, task=root_task())
    assert result.maps == [MapCall("orders", 0, [{"id": 1}, {"id": 2}])]

A child job's run: pass `parent=Upstream(...)`, the upstream run `ctx.parent()` returns (None
without it, as for a run no other run made):

    result = await run_handler(publish, parent=Upstream(41, "build", "succeeded",
                                                        output={"artifact": "a.tar"}))

A workflow node's run: pass `upstream={"extract": Upstream(...)}`, the run
`ctx.upstream("extract")` returns, with its `node` set to the key (None for a node not given):

    result = await run_handler(clean, upstream={"extract": Upstream(51, "extract-orders",
                                                                    "succeeded")})
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping

from .context import Context, JobLogger
from .errors import Fail
from .outcome import Execution, Outcome, outcome
from .protocol import Shard, Task
from .tasks import TaskResult, Upstream
from .worker import Handler, decode_params


@dataclass(frozen=True)
class MapCall:
    """One `chime_map` call a handler's `ctx.map` made: its step, its number within the
    attempt (a map of more than 10,000 items is several calls) and its items."""

    step: str
    call_no: int
    items: list[Any]


class RecordingTaskCalls:
    """`ctx.map`, `ctx.set_output`, `ctx.results`, `ctx.parent` and `ctx.upstream` without a
    database: records the calls, yields the given results and returns the given upstream run
    and node runs (each with its `node` set to its key). `map` counts every item as new, as a
    first attempt's would."""

    def __init__(self, results: Iterable[TaskResult] = (),
                 parent: Upstream | None = None,
                 upstream: Mapping[str, Upstream] | None = None) -> None:
        self.maps: list[MapCall] = []
        self.outputs: list[Any] = []
        self.results = sorted(results, key=lambda r: r.id)
        self.parent = parent
        self.nodes = {name: dataclasses.replace(run, node=name)
                      for name, run in (upstream or {}).items()}

    async def map(self, step: str, call_no: int, items: list[Any]) -> int:
        self.maps.append(MapCall(step, call_no, list(items)))
        return len(items)

    async def set_output(self, output: Any) -> bool:
        self.outputs.append(output)
        return True

    async def results_page(self, after_id: int, page: int) -> list[TaskResult]:
        return [r for r in self.results if r.id > after_id][:page]

    async def upstream(self, node: str | None = None) -> Upstream | None:
        return self.parent if node is None else self.nodes.get(node)


def root_task(parent_run_id: int = 100) -> Task:
    """A map/reduce job's root task, for `run_handler(task=...)`."""
    return Task(parent_run_id, "root", "root", depth=0)


def reduce_task(parent_run_id: int = 100) -> Task:
    """A map/reduce job's reduce task, for `run_handler(task=...)`."""
    return Task(parent_run_id, "reduce", "reduce")


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
    #: The `chime_map` calls `ctx.map` made, in order.
    maps: list[MapCall] = dataclasses.field(default_factory=list)
    #: Every value `ctx.set_output` stored, in order (the run keeps the last).
    outputs: list[Any] = dataclasses.field(default_factory=list)

    @property
    def output(self) -> Any:
        """The output the run would keep (the last `ctx.set_output`), or None."""
        return self.outputs[-1] if self.outputs else None

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
    task: Task | None = None,
    shard: Shard | None = None,
    results: Iterable[TaskResult] = (),
    parent: Upstream | None = None,
    upstream: Mapping[str, Upstream] | None = None,
) -> TestRun:
    """Runs `handler` once and returns its outcome and log lines. `cancel`, if given, is
    called with the cancellation event (set it to test a handler's cancel path); `timeout`
    (seconds) fires it like the job's timeout would. `task` places the run in a parent run
    (`shard` alone: a sharded job's shard of parent run 100); `results` is what
    `ctx.results()` yields (a reducer's test); `parent` is what `ctx.parent()` returns (a
    child job's test: the upstream run that started it; None, the default, for a run no other
    run made); `upstream` maps node names to what `ctx.upstream(node)` returns (a workflow
    node's test: the ended runs of the other nodes, each with its `node` set to its key; a
    node not in it gives None)."""
    if task is None and shard is not None:
        task = Task(100, f"shard/{shard.index}", "shard", shard=shard)
    calls = RecordingTaskCalls(results, parent, upstream)
    logger = JobLogger(run_id, attempt)
    logger.keep_all = True
    cancelled = asyncio.Event()
    ctx = Context(run_id=run_id, job=job, attempt=attempt,
                  scheduled_at=scheduled_at or datetime.now(timezone.utc), params=params,
                  log=logger, cancelled=cancelled,
                  timeout_ms=None if timeout is None else int(timeout * 1000), task=task,
                  calls=calls)
    if cancel is not None:
        cancel(cancelled)
    error: BaseException | None = None
    timed_out: int | None = None
    try:
        decoded = decode_params(params, params_type, job)
        if timeout is None:
            await handler(ctx, decoded)
        else:
            running = asyncio.ensure_future(handler(ctx, decoded))
            done, _ = await asyncio.wait({running}, timeout=timeout)
            if not done:
                timed_out = int(timeout * 1000)
                cancelled.set()
                await running
            else:
                running.result()
    except Fail as e:
        error = e
    except Exception as e:
        error = e
    result = outcome(Execution(error, timed_out_ms=timed_out,
                               cancel_requested=cancel is not None), 5000)
    return TestRun(error, result, [(line.level, line.message) for line in logger.lines],
                   calls.maps, calls.outputs)
