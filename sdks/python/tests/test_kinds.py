"""Job kinds against the real PostgreSQL and RabbitMQ: shards, broadcast tasks on the workers'
own queues (and forwarded), map, output, the reducer, and a cancel naming the parent run.

The tests act as the leader: `Env.expand` makes a fire's tasks with `chime_expand_run`, and
`Env.publish_tasks` publishes their triggers with the `task` object.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aio_pika

from chime_worker import Cancel, Context, Retry, Shard, TaskCallError, TaskResult
from chime_worker.protocol import MAX_MAP_ITEMS_PER_CALL, MAX_TASK_OUTPUT_BYTES

from conftest import Env, LogCapture, jsonb


async def test_each_shard_sees_its_index_total_param_and_parent(env: Env) -> None:
    await env.insert_kind_job("resize", "sharded", shards=3,
                              shard_params=["Lagos", "Lima", None])
    w = env.worker()
    seen: dict[int, tuple[Shard | None, int | None, str | None, Any]] = {}

    @w.handler("resize")
    async def resize(ctx: Context, params: Any) -> None:
        seen[ctx.run_id] = (ctx.shard, ctx.parent_run_id,
                            None if ctx.task is None else ctx.task.key, params)

    await env.start_worker(w)
    parent, tasks = await env.expand("resize", {"size": 64})
    assert [t["task_key"] for t in tasks] == ["shard/0", "shard/1", "shard/2"]
    await env.publish_tasks("resize", parent, tasks)
    run = await env.wait_run(parent, "succeeded")
    assert run["tasks_total"] == 3 and run["tasks_ended"] == 3 and run["tasks_failed"] == 0
    by_id = {t["id"]: t for t in tasks}
    assert set(seen) == set(by_id)
    for task_id, (shard, parent_id, key, params) in seen.items():
        index = by_id[task_id]["shard_index"]
        assert shard == Shard(index, 3, ["Lagos", "Lima", None][index])
        assert parent_id == parent and key == f"shard/{index}"
        assert params == {"size": 64}  # the run's params, on every shard


async def test_broadcast_tasks_run_on_their_worker_and_are_forwarded_to_it(
        env: Env, sdk_log: LogCapture) -> None:
    await env.insert_kind_job("flush-cache", "broadcast")
    ran: dict[int, str] = {}
    workers = [env.worker(capacity=2, hold=0), env.worker(capacity=2, hold=0)]
    for w in workers:
        def bind(me: str) -> Any:
            async def flush(ctx: Context, params: Any) -> None:
                ran[ctx.run_id] = me
            return flush

        w.handle("flush-cache", bind(w.worker_id))
        await env.start_worker(w)
    a, b = workers
    # Each worker declared its own queue with the work queue's arguments.
    async with env.amqp.channel() as ch:
        for w in workers:
            await ch.declare_queue(env.topology.worker_queue(w.worker_id), durable=True,
                                   passive=True)
    parent, tasks = await env.expand("flush-cache")
    targets = {t["id"]: t["target_worker"] for t in tasks}
    assert sorted(targets.values()) == sorted([a.worker_id, b.worker_id])
    [task_a] = [t for t in tasks if t["target_worker"] == a.worker_id]
    [task_b] = [t for t in tasks if t["target_worker"] == b.worker_id]
    # A's task through A's own queue; B's task reaches A (as if misrouted): A forwards it.
    await env.publish_tasks("flush-cache", parent, [task_a])
    await env.publish_tasks("flush-cache", parent, [task_b],
                            routing_key=env.topology.worker_key(a.worker_id))
    await env.wait_run(parent, "succeeded")
    assert ran == {task_a["id"]: a.worker_id, task_b["id"]: b.worker_id}
    assert any(f"run {task_b['id']}: broadcast task of run {parent} forwarded to worker "
               f"{b.worker_id}" in m for m in sdk_log.messages)
    for t in (task_a, task_b):
        assert (await env.task_row(t["id"]))["worker_id"] == t["target_worker"]


async def test_a_broadcast_task_and_its_retries_run_on_its_worker_only(env: Env) -> None:
    await env.insert_kind_job("rotate-logs", "broadcast",
                              retry={"max_attempts": 3, "initial": "300ms"})
    ran: list[tuple[int, int, str]] = []
    workers = [env.worker(), env.worker()]
    for w in workers:
        def bind(me: str) -> Any:
            async def rotate(ctx: Context, params: Any) -> None:
                ran.append((ctx.run_id, ctx.attempt, me))
                if ctx.attempt == 1:
                    raise Retry("again at once", after=0)  # straight to its worker's queue
                if ctx.attempt == 2:
                    raise RuntimeError("again in 300 ms")  # a delay tier, then the work queue
            return rotate

        w.handle("rotate-logs", bind(w.worker_id))
        await env.start_worker(w)
    parent, tasks = await env.expand("rotate-logs")
    # Both through the work queue (as back from a delay tier): whoever takes one forwards it
    # unless it is its own.
    await env.publish_tasks("rotate-logs", parent, tasks, routing_key="work")
    await env.wait_run(parent, "succeeded")
    assert sorted(ran) == sorted((t["id"], n, t["target_worker"]) for t in tasks
                                 for n in (1, 2, 3))


async def test_a_broadcast_task_for_a_worker_without_a_queue_is_parked_and_dead(
        env: Env) -> None:
    await env.insert_kind_job("warm-up", "broadcast")
    w = env.worker()
    ran: list[int] = []

    @w.handler("warm-up")
    async def warm(ctx: Context, params: Any) -> None:
        ran.append(ctx.run_id)

    await env.start_worker(w)
    parent, [task] = await env.expand("warm-up")
    env._job, env._parent = "warm-up", parent
    env._at = (await env.task_row(parent))["scheduled_at"]
    await env.publish(env.task_body(task, worker="py-gone"), run_id=task["id"],
                      scheduled_at=env._at, not_before=False)
    msg = await env.get_message(env.topology.parking_queue)
    reason = (f"broadcast task for worker `py-gone`: its queue "
              f"`{env.topology.worker_queue('py-gone')}` does not exist (the worker is gone); "
              "a broadcast task runs on its own worker only, so it is not run elsewhere")
    assert msg.headers["x-chime-dead-reason"] == reason
    assert json.loads(msg.body)["task"]["worker"] == "py-gone"  # the body unchanged
    row = await env.wait_run(task["id"], "dead")
    assert row["reason"] == reason and ran == []
    # A worker id no queue name can hold: implausible, the run left as it is.
    other = await env.insert_run("warm-up", None, env._at, state="queued")
    await env.publish(env.task_body({**dict(task), "id": other}, worker="w" * 250),
                      run_id=other, scheduled_at=env._at, not_before=False)
    msg = await env.get_message(env.topology.parking_queue)
    assert str(msg.headers["x-chime-dead-reason"]).startswith(
        "implausible trigger: broadcast task for worker `")
    assert "over RabbitMQ's 255, so no such worker exists" in str(
        msg.headers["x-chime-dead-reason"])
    assert await env.run_state(other) == "queued"


async def test_map_creates_sub_tasks_once_per_call_number_across_attempts(env: Env) -> None:
    await env.insert_kind_job("index", "map_reduce",
                              retry={"max_attempts": 2, "initial": "300ms"})
    w = env.worker()
    created: list[tuple[int, int]] = []
    items = list(range(MAX_MAP_ITEMS_PER_CALL + 1))

    @w.handler("index")
    async def index(ctx: Context, params: Any) -> None:
        assert ctx.task is not None and ctx.task.kind == "root"
        created.append((ctx.attempt, await ctx.map("docs", ({"doc": i} for i in items))))
        if ctx.attempt == 1:
            raise RuntimeError("crash after mapping")

    await env.start_worker(w)
    parent, [root] = await env.expand("index")
    await env.publish_tasks("index", parent, [root])
    await env.wait_run(root["id"], "succeeded", timeout=60)
    assert created == [(1, len(items)), (2, 0)]  # the retry's map made no duplicate
    rows = await env.db.fetch(
        "SELECT task_key, task_kind, map_step, map_depth, params, state FROM chime_runs "
        "WHERE parent_id = $1 AND task_kind = 'map' ORDER BY id", parent)
    assert len(rows) == len(items)
    # 10,001 items are two chime_map calls: numbered 0 and 1 within the attempt.
    assert rows[0]["task_key"] == f"{root['id']}/docs/0/0"
    assert rows[-2]["task_key"] == f"{root['id']}/docs/0/{MAX_MAP_ITEMS_PER_CALL - 1}"
    assert rows[-1]["task_key"] == f"{root['id']}/docs/1/0"
    assert [jsonb(r["params"]) for r in rows[:2]] == [{"doc": 0}, {"doc": 1}]
    assert jsonb(rows[-1]["params"]) == {"doc": MAX_MAP_ITEMS_PER_CALL}
    assert {(r["task_kind"], r["map_step"], r["map_depth"], r["state"]) for r in rows} == {
        ("map", "docs", 1, "pending")}
    # root + reduce + the items
    assert (await env.task_row(parent))["tasks_total"] == len(items) + 2


async def test_outputs_are_stored_and_the_reducer_reads_every_task(env: Env) -> None:
    await env.insert_kind_job("count-words", "map_reduce")
    w = env.worker()
    reduced: list[list[TaskResult]] = []

    @w.handler("count-words")
    async def count(ctx: Context, params: Any) -> None:
        assert ctx.task is not None
        if ctx.task.kind == "root":
            assert await ctx.map("count", ["a b", "c", "d e f"]) == 3
            # The client-side cap measures JSON as the database does: the largest output
            # the SDK lets through is stored.
            room = MAX_TASK_OUTPUT_BYTES - len(json.dumps({"x": ""}))
            assert await ctx.set_output({"x": "a" * (room % 2) + "é" * (room // 2)})
            assert await ctx.set_output({"mapped": 3})
        else:
            assert ctx.task.kind == "map" and ctx.task.step == "count" and ctx.task.depth == 1
            assert await ctx.set_output(len(params.split()))

    @w.reducer("count-words")
    async def total(ctx: Context, params: Any) -> None:
        assert ctx.task is not None and ctx.task.kind == "reduce"
        results = [r async for r in ctx.results()]
        reduced.append(results)
        await ctx.set_output(sum(r.output for r in results if r.kind == "map"))

    await env.start_worker(w)
    parent, [root] = await env.expand("count-words", {"lang": "en"})
    await env.publish_tasks("count-words", parent, [root])
    await env.wait_run(root["id"], "succeeded")
    assert jsonb((await env.task_row(root["id"]))["output"]) == {"mapped": 3}
    mapped = await env.pending_tasks(parent, "map")
    await env.publish_tasks("count-words", parent, mapped)
    for m in mapped:
        await env.wait_run(m["id"], "succeeded")
    [reduce] = await env.pending_tasks(parent, "reduce")  # the outbox's turn now
    await env.publish_tasks("count-words", parent, [reduce])
    run = await env.wait_run(parent, "succeeded")
    assert run["tasks_total"] == 5 and run["tasks_failed"] == 0
    [results] = reduced
    assert [(r.key, r.kind, r.state, r.output) for r in results] == [
        ("root", "root", "succeeded", {"mapped": 3}),
        *((m["task_key"], "map", "succeeded", n) for m, n in zip(mapped, [2, 1, 3]))]
    assert [r.params for r in results[1:]] == ["a b", "c", "d e f"]
    assert [r.step for r in results] == [None, "count", "count", "count"]
    assert jsonb((await env.task_row(reduce["id"]))["output"]) == 6


async def test_a_reduce_task_without_a_reducer_fails_without_retry(env: Env) -> None:
    await env.insert_kind_job("no-reduce", "map_reduce", retry={"max_attempts": 5})
    w = env.worker()

    @w.handler("no-reduce")
    async def root(ctx: Context, params: Any) -> None:
        pass

    await env.start_worker(w)
    parent, [root_task] = await env.expand("no-reduce")
    await env.publish_tasks("no-reduce", parent, [root_task])
    await env.wait_run(root_task["id"], "succeeded")
    [reduce] = await env.pending_tasks(parent, "reduce")  # the outbox's turn now
    await env.publish_tasks("no-reduce", parent, [reduce])
    row = await env.wait_run(reduce["id"], "failed")
    assert row["attempt"] == 1 and row["next_attempt_at"] is None
    assert row["error"] == (
        "job `no-reduce` has a reduce task but this worker registers no reducer for it: "
        "register one with @worker.reducer(\"no-reduce\") on the workers handling the job")
    run = await env.wait_run(parent, "failed")
    assert run["reason"] == "the reduce task ended failed"


async def test_a_cancel_naming_the_parent_cancels_its_running_tasks(env: Env) -> None:
    await env.insert_kind_job("long-shards", "sharded", shards=2)
    await env.insert_job("bystander")
    w = env.worker()
    stopped: list[int] = []
    bystander_done = asyncio.Event()

    @w.handler("long-shards")
    async def long_shard(ctx: Context, params: Any) -> None:
        await ctx.cancelled.wait()
        stopped.append(ctx.run_id)
        raise Cancel("stopped at the cancel")

    @w.handler("bystander")
    async def bystander(ctx: Context, params: Any) -> None:
        await bystander_done.wait()

    await env.start_worker(w)
    other = await env.trigger("bystander")
    parent, tasks = await env.expand("long-shards")
    await env.publish_tasks("long-shards", parent, tasks)
    for t in tasks:
        await env.wait_run(t["id"], "running")
    await env.wait_run(other, "running")
    # As an operator's cancel does: the request in the database, then one control message.
    await env.db.execute("UPDATE chime_runs SET cancel_requested_at = now(), "
                         "cancel_requested_by = 'op' WHERE id = $1", parent)
    async with env.amqp.channel() as ch:
        control = await ch.get_exchange(env.topology.control_exchange)
        await control.publish(aio_pika.Message(
            json.dumps({"cancel_run": {"run_id": parent}}).encode()), "")
    run = await env.wait_run(parent, "cancelled")
    assert run["reason"] == "cancelled by op"
    assert sorted(stopped) == sorted(t["id"] for t in tasks)
    for t in tasks:
        row = await env.task_row(t["id"])
        assert row["state"] == "cancelled"
        assert row["error"] == "cancelled by an operator; handler returned: stopped at the cancel"
    assert await env.run_state(other) == "running"  # a run of another parent is left alone
    bystander_done.set()
    await env.wait_run(other, "succeeded")


async def test_a_map_the_database_refuses_fails_the_task_without_retry(env: Env) -> None:
    await env.insert_kind_job("nested", "map_reduce", map_depth=1, retry={"max_attempts": 3})
    w = env.worker()
    refused: list[TaskCallError] = []

    @w.handler("nested")
    async def nested(ctx: Context, params: Any) -> None:
        try:
            await ctx.map("deeper", [1])
        except TaskCallError as e:
            refused.append(e)
            raise

    await env.start_worker(w)
    parent, [root] = await env.expand("nested")
    await env.publish_tasks("nested", parent, [root])
    await env.wait_run(root["id"], "succeeded")
    [mapped] = await env.pending_tasks(parent, "map")
    await env.publish_tasks("nested", parent, [mapped])
    row = await env.wait_run(mapped["id"], "failed")
    assert row["attempt"] == 1 and row["next_attempt_at"] is None
    [e] = refused
    assert str(e) == row["error"]
    assert str(e).startswith(f"ctx.map of run {mapped['id']} refused: invalid map_depth: "
                             "sub-tasks nest deeper than the job's map_depth 1; raise map_depth")
    assert "(map_depth = 2)" in str(e)
