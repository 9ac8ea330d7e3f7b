"""Pure parts, without services: decoding, checks, tiers, outcomes, the testing helper."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest

from chime_worker import Cancel, Context, Fail, Retry
from chime_worker.outcome import Execution, outcome
from chime_worker.protocol import (MAX_LOG_LINES_PER_ATTEMPT, DecodeError, check_trigger,
                                   copied_headers, decode_trigger, plan_wait, tier_for,
                                   unhandled_pause)
from chime_worker.testing import run_handler

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
BODY = (b'{"v":1,"run_id":42,"job":"close-unpaid-orders","group":"orders","attempt":1,'
        b'"scheduled_at":"2026-12-01T00:00:00Z","params":{"batch":500},"timeout_ms":300000,'
        b'"retry":{"max_attempts":3,"initial_ms":10000,"multiplier":2.0,"max_ms":600000,'
        b'"jitter":true},"a_future_field":1}')


def test_the_documented_trigger_decodes_and_unknown_fields_are_ignored() -> None:
    t = decode_trigger(BODY)
    assert (t.run_id, t.job, t.group, t.attempt, t.params, t.timeout_ms) == (
        42, "close-unpaid-orders", "orders", 1, {"batch": 500}, 300000)
    assert t.scheduled_at == NOW and t.retry is not None and t.retry.max_attempts == 3
    assert decode_trigger(BODY.replace(b',"params":{"batch":500}', b"")).params is None


@pytest.mark.parametrize("body,reason", [
    (b"[1]", "message body is not a Chime trigger: expected a JSON object"),
    (b'{"v":1}', "message body is not a Chime trigger: missing field `run_id`"),
    (BODY.replace(b'"attempt":1', b'"attempt":"1"'), "invalid type: string \"1\""),
    (BODY.replace(b'"attempt":1', b'"attempt":0'), "trigger attempt must be at least 1"),
    (BODY.replace(b'"v":1', b'"v":3'), "unsupported trigger protocol version 3"),
    (BODY.replace(b'2026-12-01T00:00:00Z', b'yesterday'), "is not an RFC 3339 instant"),
    (BODY.replace(b'"jitter":true', b'"jitter":1'), "`retry.jitter` must be a boolean"),
])
def test_bodies_that_are_not_triggers_are_refused_with_a_reason(body: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as e:
        decode_trigger(body)
    assert reason in str(e.value)


def test_checks_bound_every_value() -> None:
    t = decode_trigger(BODY)

    def check(headers: dict[str, Any], redelivered: bool = False, group: str = "orders"
              ) -> str | None:
        return check_trigger(t, group=group, headers=headers, redelivered=redelivered,
                             delivery_limit=5, now=NOW)

    assert check({}) is None
    assert check({"x-delivery-count": 5}, redelivered=True) is None
    assert check({}, group="billing") == ("implausible trigger: it names group `orders` but "
                                          "came from the work queue of group `billing`")
    assert "is outside 0..=5" in (check({"x-delivery-count": 6}, redelivered=True) or "")
    assert "is not an integer" in (check({"x-chime-not-before": "soon"}) or "")
    week_and_hour = (7 * 24 + 1) * 3600 * 1000
    now_ms = int(NOW.timestamp() * 1000)
    assert check({"x-chime-not-before": now_ms + week_and_hour}) is None
    assert check({"x-chime-not-before": now_ms + week_and_hour + 1}) is not None


def test_waits_use_the_largest_tier_that_fits() -> None:
    assert plan_wait(0) == 0 and plan_wait(249) == 249
    assert getattr(plan_wait(250), "name") == "250ms"
    assert getattr(plan_wait(12_345), "name") == "10s"
    assert plan_wait(2_500, 4000) == 2_500  # a trigger published ahead is held
    assert tier_for(100) is None and getattr(tier_for(86_400_000), "name") == "1h"
    assert unhandled_pause(0, 300_000).name == "5s"
    assert unhandled_pause(100_000, 200_000).name == "30s"
    assert unhandled_pause(2_000, 300).name == "250ms"


def test_copies_drop_broker_headers_and_cap_values() -> None:
    h = copied_headers({"x-death": [1], "x-delivery-count": 2, "x-chime-dead-reason": "r",
                        "x-chime-attempt": 2, "big": "é" * 5000,
                        **{f"h{i:03}": "v" * 1000 for i in range(40)}})
    assert "x-death" not in h and "x-delivery-count" not in h and "x-chime-dead-reason" not in h
    assert h["x-chime-attempt"] == 2
    assert len(h["big"].encode()) <= 4096 and h["big"].endswith("…[truncated]")
    assert h["x-chime-headers-dropped"] > 0


@pytest.mark.parametrize("execution,attempt_state,run,error", [
    (Execution(None, cancel_requested=True), "succeeded", "succeeded", None),
    (Execution(Retry("later", after=2)), "failed", "retryable", "later"),
    (Execution(Fail("bad")), "failed", "failed", "bad"),
    (Execution(Cancel("moot")), "cancelled", "cancelled", "moot"),
    (Execution(ValueError("x")), "failed", "retryable", "handler raised: ValueError: x"),
    (Execution(Cancel("stop"), cancel_requested=True), "cancelled", "cancelled",
     "cancelled by an operator; handler returned: stop"),
    (Execution("abandoned", timed_out_ms=300), "timed_out", "retryable",
     "timed out after 300ms; handler did not stop within 5s of its cancellation and was "
     "abandoned"),
    (Execution(Cancel("stop"), interrupted=True), "cancelled", "retryable",
     "interrupted by worker shutdown; handler returned: stop"),
])
def test_outcomes_follow_the_protocol_table(execution: Execution, attempt_state: str, run: str,
                                            error: str | None) -> None:
    o = outcome(execution, 5000)
    assert (o.attempt_state, o.run, o.error) == (attempt_state, run, error)


def test_a_requested_retry_delay_is_kept() -> None:
    assert outcome(Execution(Retry("later", after=2.5)), 5000).retry_after_ms == 2500
    with pytest.raises(ValueError):
        Retry("never", after=-1)


@dataclass
class Greet:
    name: str


async def greet(ctx: Context, p: Greet) -> None:
    ctx.log.info(f"hello, {p.name} (run {ctx.run_id})")


async def test_the_testing_helper_runs_a_handler_without_services() -> None:
    run = await run_handler(greet, {"name": "Ada"}, params_type=Greet)
    assert run.ok and run.outcome.run == "succeeded"
    assert run.logs == [("info", "hello, Ada (run 1)")]
    bad = await run_handler(greet, {"nom": "Ada"}, params_type=Greet, job="greet", run_id=7)
    assert isinstance(bad.error, Fail) and bad.outcome.run == "failed"
    assert "params of job `greet` do not decode into Greet: unknown field(s) nom" in str(bad.error)
    typed = await run_handler(greet, {"name": 5}, params_type=Greet)
    assert "field `name`: invalid type: 5, expected str" in str(typed.error)


async def test_the_testing_helper_fires_timeouts_and_cancels() -> None:
    async def patient(ctx: Context, p: Any) -> None:
        if await ctx.wait_cancelled(10):
            raise Cancel("gave up")

    run = await run_handler(patient, timeout=0.05)
    assert run.outcome.attempt_state == "timed_out"
    cancelled = await run_handler(patient, cancel=lambda event: event.set())
    assert cancelled.outcome.error == "cancelled by an operator; handler returned: gave up"


async def test_log_lines_beyond_the_limit_become_one_marker_line() -> None:
    from chime_worker.context import JobLogger

    logger = JobLogger(1, 1)
    for i in range(MAX_LOG_LINES_PER_ATTEMPT + 5):
        logger.debug(str(i))
    rest = logger.rest()
    assert len(rest) == MAX_LOG_LINES_PER_ATTEMPT + 1
    assert rest[-1].message == "… 5 further lines dropped (limit 10000 lines per attempt)"


def test_settings_come_from_the_environment_and_arguments_win(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from chime_worker import ConfigError, Worker

    monkeypatch.setenv("CHIME_DATABASE_URL", "postgres://env@db.internal/chime")
    monkeypatch.setenv("CHIME_AMQP_URL", "amqp://env:pw@mq.internal:5672/%2f")
    monkeypatch.setenv("CHIME_QUEUE_PREFIX", "envp")
    monkeypatch.setenv("CHIME_GROUP", "billing")
    monkeypatch.setenv("CHIME_CAPACITY", "3")
    monkeypatch.setenv("CHIME_HOLD", "10")
    w = Worker()
    assert (w.database_url, w.amqp_url, w.group, w.capacity, w.hold) == (
        "postgres://env@db.internal/chime", "amqp://env:pw@mq.internal:5672/%2f", "billing", 3,
        10)
    assert w.topology.work_queue == "envp.billing.work"
    assert Worker("g", prefix="p", capacity=1).topology.work_queue == "p.g.work"
    monkeypatch.setenv("CHIME_CAPACITY", "0")
    with pytest.raises(ConfigError, match="capacity is 0, outside 1..=65535"):
        Worker()
    monkeypatch.setenv("CHIME_CAPACITY", "many")
    with pytest.raises(ConfigError, match="CHIME_CAPACITY='many' is not an integer"):
        Worker()
    with pytest.raises(ConfigError, match="is not a Chime name"):
        Worker("Orders!", capacity=1)
    with pytest.raises(ConfigError, match="unhandled_wait"):
        Worker("g", capacity=1, unhandled_wait=2 * 86400)
    with pytest.raises(ConfigError, match="capacity \\+ hold"):
        Worker("g", capacity=60000, hold=6000)
