"""Batched claims and outcome writes (docs/protocol.md section 4, steps 4 and 7) and the
handler slots of held deliveries (step 3), against the real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import aio_pika

from chime_worker import Context
from chime_worker.batching import Collector, Failed
from chime_worker.store import Claim, ClaimRequest, OutcomeRow

from conftest import Env, LogCapture, wait_for


async def test_deliveries_that_arrive_together_are_claimed_and_recorded_in_few_statements(
        env: Env) -> None:
    n = 30
    await env.insert_job("many")
    w = env.worker(capacity=n)
    seen: list[int] = []
    all_started = asyncio.Event()
    release = asyncio.Event()

    @w.handler("many")
    async def many(ctx: Context, params: Any) -> None:
        seen.append(ctx.run_id)
        if len(seen) == n:
            all_started.set()
        await release.wait()  # they all finish together

    # Published before the worker consumes: the broker delivers them in one burst.
    at = datetime.now(timezone.utc)
    runs = [await env.insert_run("many", None, at) for _ in range(n)]
    for run_id in runs:
        await env.publish(env.trigger_body(run_id, "many", scheduled_at=at), run_id=run_id,
                          scheduled_at=at)
    await env.start_worker(w)
    await asyncio.wait_for(all_started.wait(), 15)
    release.set()
    for run_id in runs:
        await env.wait_run(run_id, "succeeded")
    assert sorted(seen) == sorted(runs)  # each run once
    assert w._claims is not None and w._outcomes is not None
    # One statement per delivery before; now the burst shares a few.
    assert w._claims.largest > 1 and w._claims.statements < n
    assert w._outcomes.largest > 1 and w._outcomes.statements < n
    for run_id in runs:
        [attempt] = await env.attempts(run_id)
        assert attempt["state"] == "succeeded" and attempt["worker_id"] == w.worker_id


async def test_a_claim_batch_claims_the_others_when_one_run_refuses(env: Env) -> None:
    await env.insert_job("batch")
    w = env.worker()
    w.handle("batch", _noop)
    await env.start_worker(w)
    runs = [await env.insert_run("batch") for _ in range(5)]
    refused = runs[2]
    await env.db.execute("UPDATE chime_runs SET cancel_requested_at = now() WHERE id = $1",
                         refused)
    assert w._claims is not None
    before = w._claims.statements
    answers = await asyncio.gather(*(
        w._claims.submit(ClaimRequest(run_id, 1, "batch", None)) for run_id in runs))
    assert w._claims.statements == before + 1  # one statement for the five
    for run_id, answer in zip(runs, answers):
        if run_id == refused:
            assert answer is None  # claimed alone next, to learn why
        else:
            assert isinstance(answer, Claim) and answer.claimed_at is not None
            assert await env.run_state(run_id) == "running"
    assert await env.run_state(refused) == "queued"
    assert await env.attempts(refused) == []


async def test_a_delivery_its_batch_refused_is_judged_alone_as_before(env: Env,
                                                                     sdk_log: LogCapture
                                                                     ) -> None:
    await env.insert_job("mixed")
    w = env.worker()
    ran: list[int] = []

    @w.handler("mixed")
    async def mixed(ctx: Context, params: Any) -> None:
        ran.append(ctx.run_id)

    at = datetime.now(timezone.utc)
    runs = [await env.insert_run("mixed", None, at) for _ in range(6)]
    cancelled = runs[3]
    await env.db.execute("UPDATE chime_runs SET cancel_requested_at = now() WHERE id = $1",
                         cancelled)
    for run_id in runs:
        await env.publish(env.trigger_body(run_id, "mixed", scheduled_at=at), run_id=run_id,
                          scheduled_at=at)
    await env.start_worker(w)
    for run_id in runs:
        if run_id != cancelled:
            await env.wait_run(run_id, "succeeded")
    await wait_for("the cancel-requested delivery acked", lambda: _async(
        any(f"run {cancelled}: cancel requested; acked without running" in m
            for m in sdk_log.messages)))
    assert sorted(ran) == sorted(r for r in runs if r != cancelled)
    assert await env.run_state(cancelled) == "queued"  # the scheduler records the cancel
    assert await env.attempts(cancelled) == []


async def test_an_outcome_batch_with_a_failing_row_records_the_others_alone(
        env: Env, sdk_log: LogCapture) -> None:
    await env.insert_job("rec")
    w = env.worker()
    w.handle("rec", _noop)
    await env.start_worker(w)
    runs = [await env.insert_run("rec") for _ in range(4)]
    claimed = await w.store.claim_many([ClaimRequest(r, 1, "rec", None) for r in runs],
                                       w.worker_id, w.group)
    assert all(isinstance(c, Claim) for c in claimed)
    bad = runs[1]
    rows = [OutcomeRow(r, 1, "failed" if r == bad else "succeeded", 5,
                       "a NUL \x00 PostgreSQL refuses" if r == bad else None,
                       "dead" if r == bad else "succeeded", "bad" if r == bad else None, None,
                       None, []) for r in runs]
    assert w._outcomes is not None
    before = w._outcomes.statements
    results = await asyncio.gather(*(w._record(row) for row in rows), return_exceptions=True)
    assert w._outcomes.statements == before + 1  # the batch; then each alone
    assert any("batched outcome write of 4 failed" in m for m in sdk_log.messages)
    for run_id, result in zip(runs, results):
        if run_id == bad:
            assert isinstance(result, Exception)  # found out: the caller keeps and requeues
            assert await env.run_state(run_id) == "running"
        else:
            assert result == (True, "succeeded")
            assert await env.run_state(run_id) == "succeeded"
            [attempt] = await env.attempts(run_id)
            assert attempt["state"] == "succeeded" and attempt["duration_ms"] == 5


async def test_a_collector_sends_what_arrives_during_a_statement_in_the_next() -> None:
    sent: list[list[int]] = []
    gate = asyncio.Event()

    async def send(items: list[int]) -> list[int]:
        sent.append(items)
        if len(sent) == 1:
            await gate.wait()
        if 4 in items:
            raise RuntimeError("boom")
        return [i * 10 for i in items]

    c: Collector[int, int] = Collector("test", send, key=lambda i: i % 100, max_batch=3)
    first = asyncio.create_task(c.submit(1))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sent == [[1]]  # a lone item goes at once
    later = [asyncio.create_task(c.submit(i)) for i in (2, 102, 3, 4, 13)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(first, *later)
    # At most 3 each, one per key and statement (102 waits for the one after 2's).
    assert sent == [[1], [2, 3, 4], [102, 13]]
    assert [results[0], results[2], results[5]] == [10, 1020, 130]
    for failed in (results[1], results[3], results[4]):  # the batch of 4 failed: each alone
        assert isinstance(failed, Failed) and failed.maybe_ours
    assert c.statements == 3 and c.largest == 3


async def _noop(ctx: Context, params: Any) -> None:
    pass


async def _async(value: Any) -> Any:
    return value


async def test_held_deliveries_start_at_their_instant_within_capacity(env: Env) -> None:
    await env.insert_job("held")
    w = env.worker(capacity=2)
    running = 0
    most = 0
    starts: dict[int, datetime] = {}

    @w.handler("held")
    async def held(ctx: Context, params: Any) -> None:
        nonlocal running, most
        starts[ctx.run_id] = datetime.now(timezone.utc)
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.1)
        running -= 1

    await env.start_worker(w)
    at = datetime.now(timezone.utc) + timedelta(seconds=1.5)  # published ahead: held
    runs = [await env.insert_run("held", None, at) for _ in range(6)]
    for run_id in runs:
        await env.publish(env.trigger_body(run_id, "held", scheduled_at=at), run_id=run_id,
                          scheduled_at=at)
    for run_id in runs:
        await env.wait_run(run_id, "succeeded")
    assert most == 2  # the slots, not the instant, bound the handlers
    assert all(starts[r] >= at for r in runs)  # never before the instant
    for run_id in runs:
        [attempt] = await env.attempts(run_id)
        assert attempt["started_at"] >= at


async def test_a_run_cancelled_while_held_is_recorded_without_running(env: Env) -> None:
    await env.insert_job("later")
    w = env.worker()
    ran: list[int] = []

    @w.handler("later")
    async def later_(ctx: Context, params: Any) -> None:
        ran.append(ctx.run_id)

    await env.start_worker(w)
    at = datetime.now(timezone.utc) + timedelta(seconds=3)
    run_id = await env.insert_run("later", None, at)
    await env.publish(env.trigger_body(run_id, "later", scheduled_at=at), run_id=run_id,
                      scheduled_at=at)
    await env.wait_run(run_id, "running")  # claimed ahead, held until the instant
    async with env.amqp.channel() as ch:
        control = await ch.get_exchange(env.topology.control_exchange)
        await control.publish(aio_pika.Message(
            json.dumps({"cancel_run": {"run_id": run_id}}).encode()), "")
    run = await env.wait_run(run_id, "cancelled")
    assert datetime.now(timezone.utc) < at  # woken by the cancel, not the instant
    assert ran == []
    assert run["error"] == ("cancelled by an operator; handler returned: cancelled before the "
                            "handler started")
