"""The worker against the real PostgreSQL and RabbitMQ, driven as the scheduler drives it."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import aio_pika

from chime_worker import Cancel, Context, Fail, Retry
from chime_worker.protocol import ms_of, rfc3339

from conftest import Env, LogCapture, later, wait_for


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
