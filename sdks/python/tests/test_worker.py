"""The worker against the real PostgreSQL and RabbitMQ, driven as the scheduler drives it."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import urllib.parse
from datetime import datetime, timedelta, timezone
from typing import Any

import aio_pika

from chime_worker import Cancel, Context, Fail, Retry, Worker
from chime_worker.protocol import ms_of, rfc3339

from conftest import AMQP_URL, Env, LogCapture, later, wait_for


async def test_success_records_the_attempt_and_its_log_lines(env: Env) -> None:
    await env.insert_job("greet")
    w = env.worker()
    seen: list[tuple[int, int, Any]] = []

    @w.handler("greet")
    async def greet(ctx: Context, params: Any) -> None:
        seen.append((ctx.run_id, ctx.attempt, params))
        ctx.log.info(f"hello, {params['name']}")
        ctx.log.warn("second line")

    await env.start_worker(w)
    run_id = await env.trigger("greet", {"name": "Ada"})
    run = await env.wait_run(run_id, "succeeded")
    assert seen == [(run_id, 1, {"name": "Ada"})]
    assert run["attempt"] == 1 and run["worker_id"] == w.worker_id and run["error"] is None
    [attempt] = await env.attempts(run_id)
    assert attempt["state"] == "succeeded" and attempt["duration_ms"] >= 0
    logs = await env.db.fetch("SELECT level, message FROM chime_run_logs WHERE run_id = $1 "
                              "ORDER BY id", run_id)
    assert [(r["level"], r["message"]) for r in logs] == [("info", "hello, Ada"),
                                                          ("warn", "second line")]


async def test_a_duplicate_delivery_runs_once(env: Env, sdk_log: LogCapture) -> None:
    await env.insert_job("once")
    w = env.worker()
    calls: list[int] = []
    release = asyncio.Event()

    @w.handler("once")
    async def once(ctx: Context, params: Any) -> None:
        calls.append(ctx.run_id)
        await release.wait()

    await env.start_worker(w)
    at = datetime.now(timezone.utc)
    run_id = await env.insert_run("once", None, at)
    body = env.trigger_body(run_id, "once", scheduled_at=at)
    await env.publish(body, run_id=run_id, scheduled_at=at)
    await env.wait_run(run_id, "running")
    await env.publish(body, run_id=run_id, scheduled_at=at)  # while it runs
    await wait_for("the duplicate acked", lambda: _async(
        any("duplicate" in m for m in sdk_log.messages)))
    release.set()
    await env.wait_run(run_id, "succeeded")
    await env.publish(body, run_id=run_id, scheduled_at=at)  # after it finished
    await wait_for("the stale copy acked", lambda: _async(
        sum("acked without running" in m for m in sdk_log.messages) >= 2))
    assert calls == [run_id]
    assert len(await env.attempts(run_id)) == 1


async def _async(value: Any) -> Any:
    return value


async def test_a_retry_goes_through_the_tier_that_fits_with_attempt_plus_one(env: Env) -> None:
    await env.insert_job("later", retry={"max_attempts": 3, "initial_ms": 1000,
                                         "multiplier": 2.0, "max_ms": 3_600_000,
                                         "jitter": False})
    w = env.worker()

    @w.handler("later")
    async def later_(ctx: Context, params: Any) -> None:
        raise Retry("not yet", after=timedelta(minutes=6))

    await env.start_worker(w)
    run_id = await env.trigger("later", {"k": 1})
    run = await env.wait_run(run_id, "retrying")
    assert run["error"] == "not yet" and run["attempt"] == 1
    next_at = run["next_attempt_at"]
    assert timedelta(minutes=5, seconds=55) < next_at - datetime.now(timezone.utc) \
        <= timedelta(minutes=6)
    [attempt] = await env.attempts(run_id)
    assert attempt["state"] == "failed" and attempt["error"] == "not yet"
    # 6 minutes ahead: the largest tier not longer than that is 5m.
    msg = await env.get_message(f"{env.prefix}.{env.group}.retry.5m")
    body = json.loads(msg.body)
    assert body["attempt"] == 2 and body["run_id"] == run_id and body["params"] == {"k": 1}
    assert msg.headers["x-chime-attempt"] == 2
    assert msg.headers["x-chime-not-before"] == ms_of(next_at)
    assert msg.message_id == str(run_id)
    assert msg.delivery_mode == aio_pika.DeliveryMode.PERSISTENT


async def test_a_retry_comes_back_and_succeeds(env: Env) -> None:
    await env.insert_job("flaky", retry={"max_attempts": 3, "initial_ms": 300,
                                         "multiplier": 1.0, "max_ms": 1000, "jitter": False})
    w = env.worker()

    @w.handler("flaky")
    async def flaky(ctx: Context, params: Any) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("transient")

    await env.start_worker(w)
    run_id = await env.trigger("flaky")
    run = await env.wait_run(run_id, "succeeded")
    assert run["attempt"] == 2
    a1, a2 = await env.attempts(run_id)
    assert a1["state"] == "failed" and a1["error"] == "handler raised: RuntimeError: transient"
    assert a2["state"] == "succeeded"
    assert a2["started_at"] >= a1["finished_at"] + timedelta(milliseconds=250)


async def test_fail_ends_the_run_without_retry(env: Env) -> None:
    await env.insert_job("reject", retry={"max_attempts": 5})
    w = env.worker()

    @w.handler("reject")
    async def reject(ctx: Context, params: Any) -> None:
        raise Fail("bad input: no customer")

    await env.start_worker(w)
    run_id = await env.trigger("reject")
    run = await env.wait_run(run_id, "failed")
    assert run["error"] == "bad input: no customer" and run["next_attempt_at"] is None
    [attempt] = await env.attempts(run_id)
    assert attempt["state"] == "failed"


async def test_attempts_exhausted_parks_the_run_dead(env: Env) -> None:
    await env.insert_job("doomed", retry={"max_attempts": 1})
    w = env.worker()

    @w.handler("doomed")
    async def doomed(ctx: Context, params: Any) -> None:
        raise Retry("still broken")

    await env.start_worker(w)
    run_id = await env.trigger("doomed")
    run = await env.wait_run(run_id, "dead")
    assert run["reason"] == "attempts exhausted (1 of 1): still broken"
    parked = await env.get_message(env.topology.parking_queue)
    assert parked.headers["x-chime-dead-reason"] == run["reason"]
    assert parked.headers["x-chime-error"] == "still broken"
    assert parked.headers["x-chime-dead-by"] == w.worker_id
    assert json.loads(parked.body)["run_id"] == run_id


async def test_a_cancel_control_message_cancels_the_running_handler(env: Env) -> None:
    await env.insert_job("long", retry={"max_attempts": 3})
    w = env.worker()

    @w.handler("long")
    async def long(ctx: Context, params: Any) -> None:
        if await ctx.wait_cancelled(60):
            raise Cancel("stopped on request")

    await env.start_worker(w)
    run_id = await env.trigger("long")
    await env.wait_run(run_id, "running")
    started = time.monotonic()
    async with env.amqp.channel() as ch:
        control = await ch.get_exchange(env.topology.control_exchange)
        await control.publish(aio_pika.Message(b"not json"), "")  # ignored
        await control.publish(aio_pika.Message(
            json.dumps({"cancel_run": {"run_id": run_id}}).encode()), "")
    run = await env.wait_run(run_id, "cancelled")
    assert time.monotonic() - started < 10
    assert run["error"] == "cancelled by an operator; handler returned: stopped on request"
    [attempt] = await env.attempts(run_id)
    assert attempt["state"] == "cancelled"


async def test_a_timeout_cancels_the_handler_and_counts_as_a_retryable_failure(env: Env) -> None:
    await env.insert_job("slow", retry={"max_attempts": 1})
    w = env.worker(cancel_grace=0.5)

    @w.handler("slow")
    async def slow(ctx: Context, params: Any) -> None:
        await asyncio.sleep(60)  # ignores its cancellation: abandoned after the grace

    await env.start_worker(w)
    run_id = await env.trigger("slow", timeout_ms=300)
    run = await env.wait_run(run_id, "dead")
    [attempt] = await env.attempts(run_id)
    assert attempt["state"] == "timed_out"
    assert attempt["error"].startswith("timed out after 300ms; handler did not stop within")
    assert 750 <= attempt["duration_ms"] < 5000
    assert run["reason"].startswith("attempts exhausted (1 of 1): timed out after 300ms")


async def test_poison_messages_are_parked_with_their_reason_and_change_no_run(env: Env) -> None:
    await env.insert_job("real")
    w = env.worker()
    calls: list[int] = []

    @w.handler("real")
    async def real(ctx: Context, params: Any) -> None:
        calls.append(ctx.run_id)

    await env.start_worker(w)
    run_id = await env.insert_run("real")
    await env.insert_job("other-job")
    other_run = await env.insert_run("other-job")
    cases: list[tuple[bytes, dict[str, Any], str]] = [
        (b"not json", {}, "message body is not a Chime trigger"),
        (json.dumps({"v": 2, "run_id": run_id}).encode(), {},
         "unsupported trigger protocol version 2 (this worker speaks 1)"),
        (b"x" * 70_000, {}, "message body is 70000 bytes, over the limit of 69632"),
        (env.trigger_body(run_id, "real", attempt=0), {}, "trigger attempt must be at least 1"),
        (env.trigger_body(run_id, "real", group="other"), {},
         f"implausible trigger: it names group `other` but came from the work queue of group "
         f"`{env.group}`"),
        (env.trigger_body(run_id, "real", timeout_ms=10**12), {},
         "implausible trigger: timeout_ms is 1000000000000 ms, over the limit"),
        (env.trigger_body(run_id, "real"), {"x-chime-not-before": 32503680000000},
         "implausible trigger: header x-chime-not-before 32503680000000"),
        (env.trigger_body(run_id, "real"), {"x-delivery-count": 3},
         "implausible trigger: x-delivery-count 3 on a first delivery"),
        (env.trigger_body(run_id, "real", attempt=3), {},
         f"implausible trigger: attempt 3 of run {run_id}, whose next attempt is 1"),
        (env.trigger_body(other_run, "other-job"), {},
         f"unknown job `other-job`: worker `{w.worker_id}` of group `{env.group}` has handlers "
         "for `real`"),
    ]
    w.unhandled_wait = 0  # an unknown job is parked at once
    for body, headers, _ in cases:
        await env.publish(body, run_id=run_id, not_before=None, headers=headers)
    reasons = []
    for _ in cases:
        m = await env.get_message(env.topology.parking_queue)
        reasons.append(str(m.headers["x-chime-dead-reason"]))
        assert m.headers["x-chime-dead-by"] == w.worker_id
    for _, _, want in cases:
        assert any(r.startswith(want) for r in reasons), (want, reasons)
    assert calls == []
    assert await env.run_state(run_id) == "queued"
    # A job no worker handles ends its (real) run dead once the wait is over.
    run = await env.wait_run(other_run, "dead")
    assert run["reason"].startswith("unknown job `other-job`")


async def test_an_early_trigger_is_claimed_ahead_and_started_at_its_instant(env: Env) -> None:
    await env.insert_job("punctual")
    w = env.worker()
    started: list[datetime] = []

    @w.handler("punctual")
    async def punctual(ctx: Context, params: Any) -> None:
        started.append(datetime.now(timezone.utc))

    await env.start_worker(w)
    at = later(1.5)
    run_id = await env.trigger("punctual", scheduled_at=at)
    run = await env.wait_run(run_id, "running", "succeeded")
    assert run["state"] == "running", "claimed ahead of its instant"
    assert datetime.now(timezone.utc) < at
    await env.wait_run(run_id, "succeeded")
    assert started[0] >= at
    [attempt] = await env.attempts(run_id)
    assert attempt["started_at"] >= at - timedelta(milliseconds=50)


async def test_a_far_ahead_delivery_is_sent_through_a_delay_tier(env: Env) -> None:
    await env.insert_job("far")
    w = env.worker()

    @w.handler("far")
    async def far(ctx: Context, params: Any) -> None:
        pass

    await env.start_worker(w)
    run_id = await env.insert_run("far")
    not_before = ms_of(later(25))
    body = env.trigger_body(run_id, "far")
    await env.publish(body, run_id=run_id, not_before=not_before)
    m = await env.get_message(f"{env.prefix}.{env.group}.retry.10s")
    assert m.body == body and m.headers["x-chime-not-before"] == not_before
    assert await env.run_state(run_id) == "queued"


async def test_log_lines_reach_the_database_while_the_handler_runs(env: Env) -> None:
    await env.insert_job("chatty")
    w = env.worker()
    release = asyncio.Event()

    @w.handler("chatty")
    async def chatty(ctx: Context, params: Any) -> None:
        ctx.log.info("first")
        for i in range(150):
            ctx.log.debug(f"line {i}")
        await release.wait()
        ctx.log.info("last")

    await env.start_worker(w)
    run_id = await env.trigger("chatty")
    await env.wait_run(run_id, "running")
    logged = time.monotonic()

    async def stored() -> int:
        return int(await env.db.fetchval(
            "SELECT count(*) FROM chime_run_logs WHERE run_id = $1", run_id))

    await wait_for("151 lines stored", lambda: _at_least(stored(), 151), timeout=5)
    assert time.monotonic() - logged < 1.0
    assert await env.run_state(run_id) == "running"
    release.set()
    await env.wait_run(run_id, "succeeded")
    rows = await env.db.fetch("SELECT message FROM chime_run_logs WHERE run_id = $1 ORDER BY id",
                              run_id)
    assert [r["message"] for r in rows] == ["first", *(f"line {i}" for i in range(150)), "last"]


async def _at_least(value: Any, n: int) -> bool:
    return bool(await value >= n)


async def test_the_heartbeat_row_is_refreshed(env: Env) -> None:
    await env.insert_job("noop")
    w = env.worker()

    @w.handler("noop")
    async def noop(ctx: Context, params: Any) -> None:
        pass

    await env.start_worker(w)
    row = await env.db.fetchrow("SELECT * FROM chime_workers WHERE id = $1", w.worker_id)
    assert row["group_name"] == env.group and row["jobs"] == ["noop"]
    first = row["heartbeat_at"]

    async def newer() -> bool:
        beat = await env.db.fetchval("SELECT heartbeat_at FROM chime_workers WHERE id = $1",
                                     w.worker_id)
        return bool(beat > first)

    await wait_for("a newer heartbeat", newer, timeout=3)
    await env.stop_workers()
    assert await env.db.fetchval("SELECT stopped_at FROM chime_workers WHERE id = $1",
                                 w.worker_id) is not None


async def test_a_long_handler_is_acked_early_and_still_recorded(env: Env, sdk_log: LogCapture
                                                                ) -> None:
    await env.insert_job("long-ack", retry={"max_attempts": 1})
    w = env.worker(ack_after=1)

    @w.handler("long-ack")
    async def long_ack(ctx: Context, params: Any) -> None:
        await asyncio.sleep(1.5)
        raise Retry("failed after the early ack")

    await env.start_worker(w)
    run_id = await env.trigger("long-ack")
    run = await env.wait_run(run_id, "dead")
    assert any("acking early" in m for m in sdk_log.messages)
    # Acked already, the dead run's message is still parked (a copy).
    parked = await env.get_message(env.topology.parking_queue)
    assert parked.headers["x-chime-dead-reason"] == run["reason"]


async def test_a_run_of_a_lost_worker_is_taken_over(env: Env) -> None:
    await env.insert_job("resume", retry={"max_attempts": 3})
    # A worker that claimed attempt 1 and died: it registered with a 100 ms heartbeat and
    # never beat again.
    await env.db.execute("SELECT chime_register_worker('ghost', $1, 'h', 1, ARRAY['resume'], 100)",
                         env.group)
    at = datetime.now(timezone.utc)
    run_id = await env.insert_run("resume", None, at)
    claimed = await env.db.fetchval(
        "SELECT count(*) FROM chime_claim(ARRAY[$1::bigint], ARRAY[1], ARRAY['resume'], "
        "ARRAY[NULL::timestamptz], 'ghost', $2)", run_id, env.group)
    assert claimed == 1

    async def ghost_lost() -> bool:
        return bool(await env.db.fetchval(
            "SELECT worker_lost FROM chime_run_snapshot($1)", run_id))

    await wait_for("the ghost worker to be lost", ghost_lost)
    w = env.worker()
    ran: list[int] = []

    @w.handler("resume")
    async def resume(ctx: Context, params: Any) -> None:
        ran.append(ctx.attempt)

    await env.start_worker(w)
    await env.publish(env.trigger_body(run_id, "resume", scheduled_at=at), run_id=run_id,
                      scheduled_at=at)
    run = await env.wait_run(run_id, "succeeded")
    assert run["attempt"] == 2 and ran == [2]
    a1, a2 = await env.attempts(run_id)
    assert a1["state"] == "lost" and a1["worker_id"] == "ghost"
    assert a1["error"].startswith("worker ghost was lost while running this attempt")
    assert a2["state"] == "succeeded" and a2["worker_id"] == w.worker_id


async def test_a_job_nobody_handles_waits_through_a_delay_tier(env: Env) -> None:
    await env.insert_job("known")
    await env.insert_job("not-here")
    w = env.worker()

    @w.handler("known")
    async def known(ctx: Context, params: Any) -> None:
        pass

    await env.start_worker(w)
    run_id = await env.trigger("not-here")
    msg = await env.get_message(f"{env.prefix}.{env.group}.retry.5s")
    assert json.loads(msg.body)["run_id"] == run_id and "x-chime-not-before" in msg.headers
    run = await env.db.fetchrow("SELECT * FROM chime_runs WHERE id = $1", run_id)
    assert run["state"] == "queued"
    assert run["reason"].startswith("no worker handles this job (waiting until ")
    assert run["reason"].endswith(f"no online worker of group `{env.group}` has a handler for "
                                  "`not-here`; then it is parked")


async def test_a_job_another_online_worker_handles_goes_to_it_through_the_shortest_tier(
        env: Env) -> None:
    await env.insert_job("peer-job")
    await env.db.execute(
        "SELECT chime_register_worker('peer', $1, 'h', 1, ARRAY['peer-job'], 60000)", env.group)
    w = env.worker()

    @w.handler("known")
    async def known(ctx: Context, params: Any) -> None:
        pass

    await env.start_worker(w)
    run_id = await env.trigger("peer-job")
    msg = await env.get_message(f"{env.prefix}.{env.group}.retry.250ms", timeout=20)
    assert json.loads(msg.body)["run_id"] == run_id
    assert await env.run_state(run_id) == "queued"


async def test_an_outcome_that_cannot_be_written_is_kept_for_the_redelivery(
        env: Env, monkeypatch: Any) -> None:
    from chime_worker.store import Store

    await env.insert_job("kept")
    w = env.worker(db_retry_budget=0)
    calls: list[int] = []

    @w.handler("kept")
    async def kept(ctx: Context, params: Any) -> None:
        calls.append(ctx.attempt)
        ctx.log.info("ran once")

    real = Store.record_outcomes
    failures = [OSError("connection refused (a database outage, simulated)")]

    async def flaky_record(self: Store, rows: Any, worker: str) -> Any:
        if failures:
            raise failures.pop()
        return await real(self, rows, worker)

    monkeypatch.setattr(Store, "record_outcomes", flaky_record)
    await env.start_worker(w)
    run_id = await env.trigger("kept")
    run = await env.wait_run(run_id, "succeeded")
    assert calls == [1] and failures == [] and run["attempt"] == 1
    [attempt] = await env.attempts(run_id)
    assert attempt["state"] == "succeeded"
    logs = await env.db.fetch("SELECT message FROM chime_run_logs WHERE run_id = $1", run_id)
    assert [r["message"] for r in logs] == ["ran once"]


async def test_a_bug_outside_the_handler_ends_the_claimed_run_dead_and_parks_it(
        env: Env, monkeypatch: Any) -> None:
    from chime_worker.worker import Worker

    await env.insert_job("buggy", retry={"max_attempts": 3})
    w = env.worker()

    @w.handler("buggy")
    async def buggy(ctx: Context, params: Any) -> None:
        pass

    async def broken_settle(self: Worker, *args: Any, **kw: Any) -> None:
        raise KeyError("a bug in the worker")

    monkeypatch.setattr(Worker, "_settle", broken_settle)
    await env.start_worker(w)
    run_id = await env.trigger("buggy")
    run = await env.wait_run(run_id, "dead")
    reason = "the worker panicked handling this delivery: KeyError: 'a bug in the worker'"
    assert run["reason"] == reason
    [attempt] = await env.attempts(run_id)
    assert attempt["state"] == "failed" and attempt["error"] == reason
    parked = await env.get_message(env.topology.parking_queue)
    assert parked.headers["x-chime-dead-reason"] == reason


async def test_a_worker_role_granted_its_group_runs_its_jobs_and_parks_another_groups_run(
        env: Env) -> None:
    """Connected as a login role granted only its group (docs/protocol.md section 11), the
    worker runs its group's job end to end, and a trigger naming a run of another group (which
    the role may not act for: 42501) is parked with its reason and changes nothing."""
    role = f"chime_py_{secrets.token_hex(5)}"
    await env.db.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        await env.db.execute("SELECT chime_grant_worker($1, $2, 'pytest')", role, env.group)
        await env.insert_job("mine")
        await env.insert_job("theirs", group="another-group")
        theirs = await env.insert_run("theirs", group="another-group")
        url = urllib.parse.urlsplit(env.db_url)
        user_url = url._replace(netloc=f"{role}@{url.hostname}:{url.port or 5432}").geturl()
        w = Worker(env.group, database_url=user_url, amqp_url=AMQP_URL, prefix=env.prefix,
                   worker_id=f"py-{secrets.token_hex(3)}", heartbeat_interval=0.2)
        ran: list[int] = []

        @w.handler("mine")
        async def mine(ctx: Context, params: Any) -> None:
            ctx.log.info("ran as a least-privileged role")
            ran.append(ctx.run_id)

        @w.handler("theirs")
        async def not_mine(ctx: Context, params: Any) -> None:
            ran.append(ctx.run_id)

        await env.start_worker(w)
        sessions = await env.db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", role)
        assert sessions > 0, "the worker connects as the granted role"
        run_id = await env.trigger("mine")
        await env.wait_run(run_id, "succeeded")
        assert await env.db.fetchval(
            "SELECT message FROM chime_run_logs WHERE run_id = $1", run_id) == \
            "ran as a least-privileged role"
        await env.publish(env.trigger_body(theirs, "theirs"), run_id=theirs)
        parked = await env.get_message(env.topology.parking_queue)
        reason = parked.headers["x-chime-dead-reason"]
        assert reason.startswith(f"implausible trigger: run {theirs} is not of a group this "
                                 "worker may act for: "), reason
        assert ran == [run_id]
        assert await env.run_state(theirs) == "queued"
        assert await env.attempts(theirs) == []
        await env.stop_workers()
    finally:
        await env.db.execute(f'DROP OWNED BY "{role}"')
        await env.db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
        await env.db.execute(f'DROP ROLE IF EXISTS "{role}"')
