"""What a handler gets: `Context` (run id, attempt, instant, params, cancellation, log, and
for a task of a broadcast, sharded or map/reduce job its place in the run, map, output and the
other tasks' results; for a child job's run, the upstream run that started it; for a workflow
node's run, the runs of the other nodes of its workflow run).

Log lines written through `ctx.log` reach `chime_run_logs` while the handler runs: the worker
writes a batch when 100 lines wait or the oldest waiting line is 250 ms old, and the rest with
the outcome, in order, none twice; at most 10,000 lines per attempt, then one marker line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable

from .protocol import MAX_LOG_LINES_PER_ATTEMPT, TASK_RESULTS_PAGE, Shard, Task, cap_bytes
from .tasks import (TaskCallError, TaskCalls, TaskResult, Upstream, check_map, check_output,
                    check_results, chunks)

FLUSH_EVERY = 100
FLUSH_AFTER_S = 0.25
MAX_LINE_BYTES = 16 * 1024
LEVELS = ("debug", "info", "warn", "error")

_py_logger = logging.getLogger("chime_worker.job")
_PY_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
              "error": logging.ERROR}


@dataclass(frozen=True)
class LogLine:
    at: datetime
    level: str
    message: str


BatchWriter = Callable[[list[LogLine]], Awaitable[None]]


class JobLogger:
    """Collects one attempt's log lines; a flusher (the worker's) sends them in batches."""

    def __init__(self, run_id: int = 0, attempt: int = 0) -> None:
        self._run_id = run_id
        self._attempt = attempt
        self._pending: list[tuple[float, LogLine]] = []
        self._kept = 0
        self._over = 0
        self._wake = asyncio.Event() if _has_loop() else None
        self._closing = False
        self.lines: list[LogLine] = []  # every line kept (the testing helper reads it)
        self.keep_all = False
        #: Called once, at the first line kept (the worker starts the writing task then).
        self.on_first_line: Callable[[], None] | None = None

    def log(self, level: str, message: str) -> None:
        if level not in LEVELS:
            raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
        _py_logger.log(_PY_LEVELS[level], "[run %s attempt %s] %s", self._run_id,
                       self._attempt, message)
        if self._kept >= MAX_LOG_LINES_PER_ATTEMPT:
            self._over += 1
            return
        self._kept += 1
        line = LogLine(datetime.now(timezone.utc), level, cap_bytes(str(message),
                                                                    MAX_LINE_BYTES))
        if self.keep_all:
            self.lines.append(line)
        self._pending.append((time.monotonic(), line))
        if self.on_first_line is not None:
            start, self.on_first_line = self.on_first_line, None
            start()
        if self._wake is not None and (len(self._pending) == 1
                                       or len(self._pending) >= FLUSH_EVERY):
            self._wake.set()

    def debug(self, message: str) -> None:
        self.log("debug", message)

    def info(self, message: str) -> None:
        self.log("info", message)

    def warn(self, message: str) -> None:
        self.log("warn", message)

    warning = warn

    def error(self, message: str) -> None:
        self.log("error", message)

    # ---- the worker's side -------------------------------------------------------------

    def _take(self) -> list[LogLine]:
        batch = [line for _, line in self._pending]
        self._pending = []
        return batch

    def _put_back(self, batch: list[LogLine]) -> None:
        now = time.monotonic()
        self._pending = [(now, line) for line in batch] + self._pending

    async def flush_loop(self, write: BatchWriter) -> None:
        """Writes batches until `close()`: at 100 lines, or when the oldest is 250 ms old. A
        batch being written when `close()` is called is finished first (order)."""
        assert self._wake is not None
        log = logging.getLogger("chime_worker")
        while not self._closing:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            age = time.monotonic() - self._pending[0][0]
            if len(self._pending) < FLUSH_EVERY and age < FLUSH_AFTER_S:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), FLUSH_AFTER_S - age)
                except asyncio.TimeoutError:
                    pass
                continue
            batch = self._take()
            try:
                await write(batch)
            except Exception as e:  # the rest goes with the outcome
                log.warning("run %s: writing %d log lines failed (%s); they go with the "
                            "outcome", self._run_id, len(batch), e)
                self._put_back(batch)
                await asyncio.sleep(FLUSH_AFTER_S)

    def close(self) -> None:
        """Ends `flush_loop` after the batch it is writing, if any."""
        self._closing = True
        self.on_first_line = None
        if self._wake is not None:
            self._wake.set()

    def rest(self) -> list[LogLine]:
        """The lines not written yet, with the marker line for lines over the limit."""
        batch = self._take()
        if self._over:
            batch.append(LogLine(datetime.now(timezone.utc), "warn",
                                 f"… {self._over} further lines dropped (limit "
                                 f"{MAX_LOG_LINES_PER_ATTEMPT} lines per attempt)"))
            self._over = 0
        return batch


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


class Context:
    """One attempt of one run, as its handler sees it."""

    def __init__(self, *, run_id: int, job: str, attempt: int, scheduled_at: datetime,
                 params: Any, log: JobLogger, cancelled: asyncio.Event,
                 timeout_ms: int | None = None, task: Task | None = None,
                 calls: TaskCalls | None = None) -> None:
        self.run_id = run_id
        self.job = job
        self.attempt = attempt
        self.scheduled_at = scheduled_at
        self.params = params
        self.log = log
        self.cancelled = cancelled
        self.timeout_ms = timeout_ms
        #: Which task of its run this is (None for a single run): `kind` is `broadcast`,
        #: `shard`, `root`, `map` or `reduce`; `run_id` is the task's own run id.
        self.task = task
        self._calls = calls
        self._map_calls = 0
        self._map_lock = asyncio.Lock()

    @property
    def logger(self) -> JobLogger:
        """Same as `log`."""
        return self.log

    @property
    def is_cancelled(self) -> bool:
        """True once the run's cancellation fired (operator cancel, timeout or shutdown)."""
        return self.cancelled.is_set()

    async def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Waits until cancellation fires (True) or `timeout` seconds pass (False)."""
        try:
            await asyncio.wait_for(self.cancelled.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    # ---- job kinds ---------------------------------------------------------------------

    @property
    def shard(self) -> Shard | None:
        """A sharded job's shard: `index` (0-based), `total`, and `param` (the job's
        `shard_params` entry for the index, None without one); None for other runs."""
        return None if self.task is None else self.task.shard

    @property
    def parent_run_id(self) -> int | None:
        """The run (the fire) this task belongs to; None for a single run."""
        return None if self.task is None else self.task.parent_run_id

    def _backend(self, what: str) -> TaskCalls:
        if self._calls is None:
            raise TaskCallError(f"{what}: this context has no worker behind it: run the handler "
                                "in a Worker, or with chime_worker.testing.run_handler")
        return self._calls

    async def map(self, step: str, items: Iterable[Any]) -> int:
        """Maps `items` to sub-tasks of this run under `step` (1-64 of A-Z a-z 0-9 _ . -),
        one per item, the item being the sub-task's params; its handler is the job's handler
        again, with `ctx.task.kind == "map"` and `ctx.task.step == step`. Only the root task
        of a map_reduce job and the tasks it mapped map. Returns how many sub-tasks were new.

        The sub-tasks are stored before this returns (the leader publishes them); a retried
        attempt that maps the same items in the same order makes no duplicate: each call to
        the database (10,000 items at most; more are split) is numbered within the attempt.
        Await map calls one after another, not concurrently, so the numbering is the same on
        every attempt."""
        materialized = list(items)
        check_map(self.task, self.run_id, step, materialized)
        calls = self._backend("ctx.map")
        created = 0
        async with self._map_lock:
            for chunk in chunks(materialized):
                call_no = self._map_calls  # from 0, as every SDK numbers them
                self._map_calls += 1
                created += await calls.map(step, call_no, chunk)
        return created

    async def set_output(self, value: Any) -> bool:
        """Stores `value` (JSON, at most 64 KiB as text) as this run's output: what a reducer
        reads in `ctx.results()` and the API shows. A later call replaces it. False when this
        attempt is not running any more (nothing written)."""
        check_output(value)
        return await self._backend("ctx.set_output").set_output(value)

    async def results(self) -> AsyncIterator[TaskResult]:
        """The other tasks of this run, in creation order, with their state and output: what
        a reduce task's reducer reads (it runs once every other task has ended). Read in pages
        of 1000 as the iteration goes."""
        check_results(self.task, self.run_id)
        calls = self._backend("ctx.results")
        after = 0
        while True:
            page = await calls.results_page(after, TASK_RESULTS_PAGE)
            for result in page:
                yield result
            if len(page) < TASK_RESULTS_PAGE:
                return
            after = page[-1].id

    # ---- child jobs --------------------------------------------------------------------

    async def parent(self) -> Upstream | None:
        """The run that ended and started this one, when this is a run of a child job (a job
        named in another's `on_success`, `on_failure` or `on_complete`): its `run_id`, `job`,
        `state`, `output` (what its handler stored with `set_output`), `error` and
        `finished_at`. None for any other run. In a task of a child job's fire (a shard, a
        broadcast copy, a mapped task), the run that started the fire.

        Not to be confused with `parent_run_id`, a task's own fire (the parent run its tasks
        belong to): a child run is a run of its own, not a task of its upstream run. Each call
        reads the database (`chime_upstream_runs`) once."""
        return await self._backend("ctx.parent").upstream()

    # ---- workflows ---------------------------------------------------------------------

    async def upstream(self, node: str) -> Upstream | None:
        """In a workflow node's run (trigger `workflow`): the latest ended run of node `node`
        of the same workflow run (its latest round, after a rerun), as an `Upstream` with
        `node` set: its `run_id`, `job`, `state`, `output`, `error` and `finished_at`. None
        when this is no workflow node's run, when the workflow has no node of that name, or
        that node has no ended run (yet: the nodes this one comes after have all ended when it
        starts); this node's own name gives None. In a task of a node's run (a shard, a
        broadcast copy, a mapped task), the nodes of the node run's workflow run.

        `parent()` is a child job's upstream run, never a node's. Each call reads the database
        (`chime_upstream_runs`) once."""
        if not isinstance(node, str):
            raise TaskCallError(f"ctx.upstream: node {node!r} is not a node name: pass the "
                                "name of a node of the workflow, as in its `after`")
        return await self._backend("ctx.upstream").upstream(node)
