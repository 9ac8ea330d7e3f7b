"""Job kinds without services: the trigger's `task`, the handler's checks, the testing helper."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chime_worker import Context, Shard, Task, TaskCallError, TaskResult
from chime_worker.protocol import (MAX_MAP_ITEMS_PER_CALL, MAX_TASK_OUTPUT_BYTES, DecodeError,
                                   Topology, decode_trigger)
from chime_worker.testing import MapCall, reduce_task, root_task, run_handler

BASE = (b'{"v":1,"run_id":7,"job":"resize","group":"media","attempt":1,'
        b'"scheduled_at":"2026-12-01T00:00:00Z","params":{"size":64}')
# The wire test of protocol/src/wire.rs (a_task_trigger_round_trips...).
SHARD_TASK = (b'"task":{"parent_run_id":41,"key":"shard/2","kind":"shard","shard":{"index":2,'
              b'"total":3,"param":"Guangzhou"}}')


def body(task: bytes | None) -> bytes:
    return BASE + (b"," + task if task else b"") + b"}"


def test_the_task_object_decodes_and_a_single_run_has_none() -> None:
    assert decode_trigger(body(None)).task is None
    assert decode_trigger(body(b'"task":null')).task is None
    t = decode_trigger(body(SHARD_TASK)).task
    assert t == Task(41, "shard/2", "shard", Shard(2, 3, "Guangzhou"))
    b = decode_trigger(body(b'"task":{"parent_run_id":5,"key":"worker/w1","kind":"broadcast",'
                            b'"worker":"w1","future":true}')).task
    assert b == Task(5, "worker/w1", "broadcast", worker="w1")
    m = decode_trigger(body(b'"task":{"parent_run_id":5,"key":"6/docs/1/0","kind":"map",'
                            b'"step":"docs","depth":1}')).task
    assert m is not None and (m.kind, m.step, m.depth, m.shard) == ("map", "docs", 1, None)


@pytest.mark.parametrize("task,reason", [
    (b'"task":[1]', "invalid type: sequence, expected an object (field `task`)"),
    (b'"task":{"parent_run_id":1,"key":"k","kind":"fanout"}', "unknown variant `fanout`"),
    (b'"task":{"key":"k","kind":"root"}', "missing field `parent_run_id`"),
    (b'"task":{"parent_run_id":1,"key":"k","kind":"shard","shard":{"index":-1,"total":2}}',
     "field `index` is -1"),
    (b'"task":{"parent_run_id":1,"key":"k","kind":"broadcast","worker":5}',
     "expected a string (field `worker`)"),
])
def test_a_bad_task_object_is_refused_with_a_reason(task: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match="message body is not a Chime trigger") as e:
        decode_trigger(body(task))
    assert reason in str(e.value)


def test_workers_own_queues_are_named_by_the_topology() -> None:
    t = Topology("chime", "media")
    assert t.worker_queue("w-1") == "chime.media.worker.w-1"
    assert t.worker_key("w-1") == "worker.w-1"


async def shard_handler(ctx: Context, params: Any) -> None:
    assert ctx.shard is not None
    ctx.log.info(f"shard {ctx.shard.index + 1} of {ctx.shard.total}: {ctx.shard.param} "
                 f"(run {ctx.parent_run_id})")


async def test_the_testing_helper_gives_a_shard_its_place() -> None:
    run = await run_handler(shard_handler, shard=Shard(1, 4, "Lima"))
    assert run.ok and run.logs == [("info", "shard 2 of 4: Lima (run 100)")]
    single = await run_handler(shard_handler)
    assert not single.ok and single.outcome.run == "retryable"


async def test_map_is_recorded_in_calls_of_at_most_10000_items_numbered_per_attempt() -> None:
    async def root(ctx: Context, params: Any) -> None:
        assert await ctx.map("pages", range(MAX_MAP_ITEMS_PER_CALL + 2)) == \
            MAX_MAP_ITEMS_PER_CALL + 2
        assert await ctx.map("extra", [{"id": "x"}]) == 1
        assert await ctx.map("none", []) == 0

    run = await run_handler(root, task=root_task())
    assert run.ok, run.error
    assert [(m.step, m.call_no, len(m.items)) for m in run.maps] == [
        ("pages", 0, MAX_MAP_ITEMS_PER_CALL), ("pages", 1, 2), ("extra", 2, 1)]
    assert run.maps[1].items == [MAX_MAP_ITEMS_PER_CALL, MAX_MAP_ITEMS_PER_CALL + 1]
    assert run.maps[2] == MapCall("extra", 2, [{"id": "x"}])


@pytest.mark.parametrize("task,step,items,message", [
    (None, "s", [1], "run 1 is a single run; only the root task of a map_reduce job"),
    (Task(1, "shard/0", "shard", Shard(0, 1)), "s", [1], "run 1 is a shard task"),
    (root_task(), "no spaces", [1], "step 'no spaces' is not a step name: use 1 to 64"),
    (root_task(), "s" * 65, [1], "is not a step name"),
    (root_task(), "s", [float("nan")], "item 0 of step 's' is not JSON"),
    (root_task(), "s", [1, "x" * 70_000], "item 1 of step 's' is 70002 bytes of JSON, over the "
                                          "limit of 65536 (limits::MAX_PARAMS_BYTES)"),
])
async def test_a_wrong_map_call_fails_the_attempt_without_retry(
        task: Task | None, step: str, items: list[Any], message: str) -> None:
    async def mapper(ctx: Context, params: Any) -> None:
        await ctx.map(step, items)

    run = await run_handler(mapper, task=task)
    assert isinstance(run.error, TaskCallError) and message in str(run.error)
    assert run.outcome.run == "failed" and run.maps == []


async def test_output_is_recorded_and_capped_at_64_kib() -> None:
    async def outputs(ctx: Context, params: Any) -> None:
        assert await ctx.set_output({"rows": 1})
        await ctx.set_output({"rows": 2, "city": "Zürich"})

    run = await run_handler(outputs)
    assert run.ok and run.outputs == [{"rows": 1}, {"rows": 2, "city": "Zürich"}]
    assert run.output == {"rows": 2, "city": "Zürich"}

    # As PostgreSQL prints jsonb: `"x": ` is 5 bytes plus the quoted string and the braces.
    room = MAX_TASK_OUTPUT_BYTES - len(json.dumps({"x": ""}))

    async def exact(ctx: Context, params: Any) -> None:
        await ctx.set_output({"x": "a" * room})

    assert (await run_handler(exact)).ok

    async def too_big(ctx: Context, params: Any) -> None:
        await ctx.set_output({"x": "é" * room})  # 2 bytes each in UTF-8

    run = await run_handler(too_big)
    assert isinstance(run.error, TaskCallError) and run.outcome.run == "failed"
    assert str(run.error) == (
        f"ctx.set_output: output is {MAX_TASK_OUTPUT_BYTES + room} bytes of JSON, over the "
        "limit of 65536 (limits::MAX_TASK_OUTPUT_BYTES): return a summary or a reference (a "
        "key, a URL), not the data")
    assert run.outputs == []


async def test_a_reducer_reads_every_result_across_pages() -> None:
    results = [TaskResult(i, f"k/{i}", "map", "s", None, "succeeded", i, None, None)
               for i in range(1, 2502)]
    seen: list[int] = []

    async def total(ctx: Context, params: Any) -> None:
        seen.extend([r.output async for r in ctx.results()])
        await ctx.set_output(sum(seen))

    run = await run_handler(total, task=reduce_task(), results=reversed(results))
    assert run.ok and seen == list(range(1, 2502)) and run.output == sum(range(1, 2502))

    async def single(ctx: Context, params: Any) -> None:
        [r async for r in ctx.results()]

    run = await run_handler(single)
    assert isinstance(run.error, TaskCallError) and "is a single run, not a task" in str(
        run.error)


async def test_a_context_without_a_worker_names_the_fix() -> None:
    import asyncio

    from chime_worker import JobLogger
    from datetime import datetime, timezone

    ctx = Context(run_id=1, job="j", attempt=1, scheduled_at=datetime.now(timezone.utc),
                  params=None, log=JobLogger(), cancelled=asyncio.Event(), task=root_task())
    with pytest.raises(TaskCallError, match="no worker behind it: run the handler in a Worker"):
        await ctx.map("s", [1])


async def test_the_example_map_reduce_job_counts_words() -> None:
    from chime_worker.example import build

    worker = build("examples")
    root = await run_handler(worker.handlers["word-count"].fn, {"texts": ["a b", "c"]},
                             task=root_task())
    assert root.ok and root.maps == [MapCall("count", 0, ["a b", "c"])]
    mapped = await run_handler(worker.handlers["word-count"].fn, "a b c",
                               task=Task(100, "1/count/1/0", "map", step="count", depth=1))
    assert mapped.ok and mapped.output == 3
    results = [TaskResult(1, "root", "root", None, None, "succeeded", None, None, None),
               TaskResult(3, "1/count/1/0", "map", "count", None, "succeeded", 3, None, "a b c"),
               TaskResult(4, "1/count/1/1", "map", "count", None, "failed", None, "x", "d")]
    total = await run_handler(worker.reducers["word-count"].fn, task=reduce_task(),
                              results=results)
    assert total.ok and total.output == {"words": 3}
