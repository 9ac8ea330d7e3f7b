"""Job kinds from a handler's side: what `ctx.map`, `ctx.set_output` and `ctx.results` check,
and `ctx.parent`'s and `ctx.upstream`'s answer (`Upstream`).

A broadcast, sharded or map/reduce job's fire is a parent run with tasks; each task is a run
of its own (claimed, retried, logged as any run) whose trigger carries a `task` object
(`protocol.Task`). A child job's run (trigger `child`) was made by the end of another run, its
upstream run, which `ctx.parent()` reads; a workflow node's run (trigger `workflow`) reads the
runs of the other nodes of its workflow run with `ctx.upstream(node)`. The calls a handler
makes for its run go through a
`TaskCalls` backend: the worker's (the database functions `chime_map`, `chime_set_output`,
`chime_task_results`, `chime_upstream_runs`) or the testing helper's recorder. The checks here
are the database's bounds, made before the round trip so a mistake is named where it was made;
the database checks them again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from .errors import Fail
from .protocol import MAX_MAP_ITEMS_PER_CALL, MAX_PARAMS_BYTES, MAX_TASK_OUTPUT_BYTES, Task

#: A map step's name (`chime_map`'s check).
STEP = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: The task kinds whose handler may map (`chime_map` refuses others).
MAPPING_KINDS = ("root", "map")


class TaskCallError(Fail):
    """A map, output, results, parent or upstream call the handler made wrongly (or the database
    refused): not fixed by another attempt, so a handler that lets it propagate fails without
    retry. The message names the field, the value and the fix."""

    kind = "task-call"


@dataclass(frozen=True)
class TaskResult:
    """Another task of the run, as a reducer reads it (`chime_task_results`)."""

    id: int
    #: `shard/<n>`, `worker/<id>`, `root`, or `<caller>/<step>/<call>/<n>` for a mapped one.
    key: str
    #: `broadcast`, `shard`, `root` or `map`.
    kind: str
    #: A mapped sub-task's step name, else None.
    step: str | None
    #: A shard's index, else None.
    shard_index: int | None
    #: Its state: `succeeded`, `failed`, `dead`, `cancelled`, `lost`, ... (a reduce task runs
    #: once every other task has ended).
    state: str
    #: What its handler stored with `ctx.set_output`, or None.
    output: Any
    #: Its last attempt's error, or None.
    error: str | None
    #: Its params: a mapped sub-task's item, else the run's params.
    params: Any


@dataclass(frozen=True)
class Upstream:
    """The run that ended and started this one: a child job's upstream run, as `ctx.parent()`
    reads it (`chime_upstream_runs`; docs/runs.md, "Child runs"); or, in a workflow node's
    run, the latest ended run of another node of the same workflow run, as
    `ctx.upstream(node)` reads it (with `node` set). In a unit test,
    `Upstream(run_id, job, state)` with the other fields as the test needs."""

    #: Its run id.
    run_id: int
    #: Its job.
    job: str
    #: How it ended: `succeeded` for an `on_success` child, `failed`, `dead` or `lost` for an
    #: `on_failure` one, any of them for `on_complete`; a workflow node's run, any end
    #: (`skipped` included, after an `always` edge).
    state: str
    #: What its handler stored with `ctx.set_output`, or None (a broadcast, sharded or
    #: map/reduce fire has none of its own: its tasks have theirs).
    output: Any = None
    #: Its last error, if it failed.
    error: str | None = None
    #: When it ended.
    finished_at: datetime | None = None
    #: The workflow node it is the run of (`ctx.upstream`); None for a child job's upstream
    #: run (`ctx.parent`).
    node: str | None = None


class TaskCalls(Protocol):
    """The calls behind `ctx.map`, `ctx.set_output`, `ctx.results`, `ctx.parent` and
    `ctx.upstream`, for one attempt."""

    async def map(self, step: str, call_no: int, items: list[Any]) -> int:
        """Creates the sub-tasks of one `chime_map` call; returns how many were new."""

    async def set_output(self, output: Any) -> bool:
        """Stores the output; False when the attempt is not running any more."""

    async def results_page(self, after_id: int, page: int) -> list[TaskResult]:
        """The run's other tasks by id after `after_id`, at most `page` of them."""

    async def upstream(self, node: str | None = None) -> Upstream | None:
        """With `node` None, the run that ended and started this run's fire (a child job's);
        with a node name, the latest ended run of that node of this run's workflow run; or
        None."""


def json_bytes(value: Any, what: str) -> int:
    """The size of `value` as JSON text (UTF-8, as PostgreSQL's jsonb prints it, with a space
    after `:` and `,`); raises TaskCallError when it is not JSON."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TaskCallError(f"{what} is not JSON ({e}): pass dicts, lists, strings, numbers "
                            "(finite), booleans and None") from None
    return len(text.encode("utf-8"))


def check_output(value: Any) -> None:
    size = json_bytes(value, "ctx.set_output: output")
    if size > MAX_TASK_OUTPUT_BYTES:
        raise TaskCallError(
            f"ctx.set_output: output is {size} bytes of JSON, over the limit of "
            f"{MAX_TASK_OUTPUT_BYTES} (limits::MAX_TASK_OUTPUT_BYTES): return a summary or a "
            "reference (a key, a URL), not the data")


def check_map(task: Task | None, run_id: int, step: str, items: list[Any]) -> None:
    kind = task.kind if task is not None else None
    if kind not in MAPPING_KINDS:
        raise TaskCallError(
            f"ctx.map: run {run_id} is {f'a {kind} task' if kind else 'a single run'}; only "
            "the root task of a map_reduce job or a task it mapped maps: call map from such a "
            "task's handler (set `kind = \"map_reduce\"` in the job file)")
    if not isinstance(step, str) or not STEP.fullmatch(step):
        raise TaskCallError(f"ctx.map: step {str(step)[:80]!r} is not a step name: use 1 to 64 "
                            "characters of A-Z, a-z, 0-9, _ . -")
    for n, item in enumerate(items):
        size = json_bytes(item, f"ctx.map: item {n} of step {step!r}")
        if size > MAX_PARAMS_BYTES:
            raise TaskCallError(
                f"ctx.map: item {n} of step {step!r} is {size} bytes of JSON, over the limit "
                f"of {MAX_PARAMS_BYTES} (limits::MAX_PARAMS_BYTES): map references (ids, "
                "keys), not the data")


def chunks(items: list[Any]) -> list[list[Any]]:
    """`items` in `chime_map` calls of at most MAX_MAP_ITEMS_PER_CALL, in order."""
    return [items[i:i + MAX_MAP_ITEMS_PER_CALL]
            for i in range(0, len(items), MAX_MAP_ITEMS_PER_CALL)]


def check_results(task: Task | None, run_id: int) -> None:
    if task is None:
        raise TaskCallError(
            f"ctx.results: run {run_id} is a single run, not a task: the results of a run's "
            "tasks are read by its reducer (register one with @worker.reducer(\"<job>\") for a "
            "map_reduce job)")
