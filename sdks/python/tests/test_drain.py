"""The example worker in a subprocess: SIGTERM drains it (docs/protocol.md section 9)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from conftest import AMQP_URL, Env, wait_for


async def test_sigterm_lets_running_handlers_finish_then_interrupts_the_rest(env: Env) -> None:
    await env.insert_job("sleep", retry={"max_attempts": 3, "initial_ms": 60_000,
                                         "multiplier": 1.0, "max_ms": 60_000,
                                         "jitter": False})
    worker_id = f"py-drain-{os.getpid()}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "chime_worker.example", env.group,
        env={**os.environ, "CHIME_DATABASE_URL": env.db_url, "CHIME_AMQP_URL": AMQP_URL,
             "CHIME_QUEUE_PREFIX": env.prefix, "CHIME_WORKER_ID": worker_id,
             "CHIME_DRAIN_TIMEOUT": "2", "CHIME_LOG": "INFO"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        async def registered() -> Any:
            if proc.returncode is not None:
                out = await proc.stdout.read() if proc.stdout else b""
                raise AssertionError(f"the example exited: {out.decode()[-2000:]}")
            return await env.db.fetchval("SELECT count(*) FROM chime_workers WHERE id = $1",
                                         worker_id)

        await wait_for("the example worker to register", registered, timeout=20)

        def handler_started(run_id: int) -> Callable[[], Awaitable[Any]]:
            # "running" is the claim; the handler itself starts once it has a slot, and its
            # first log line says it is sleeping: the signal below must find both handlers
            # running, not one still waiting to start.
            async def check() -> Any:
                return await env.db.fetchval(
                    "SELECT count(*) FROM chime_run_logs WHERE run_id = $1 AND message LIKE "
                    "'sleeping %'", run_id)
            return check

        long = await env.trigger("sleep", {"seconds": 120.0})
        await wait_for("the long handler to start", handler_started(long), timeout=20)
        short = await env.trigger("sleep", {"seconds": 1.5})
        await wait_for("the short handler to start", handler_started(short), timeout=20)
        assert await env.run_state(short) == "running"
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, out.decode()[-2000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    # The short one finished within the drain timeout; the long one was interrupted (a
    # retryable failure: retrying, its retry published through a delay tier).
    assert await env.run_state(short) == "succeeded"
    run = await env.db.fetchrow("SELECT * FROM chime_runs WHERE id = $1", long)
    assert run["state"] == "retrying", dict(run)
    assert run["error"] == ("interrupted by worker shutdown; handler returned: cancelled while "
                            "sleeping")
    [attempt] = await env.attempts(long)
    assert attempt["state"] == "cancelled"
    retry = await env.get_message(f"{env.prefix}.{env.group}.retry.30s")
    assert retry.headers["x-chime-attempt"] == 2
    assert await env.db.fetchval("SELECT stopped_at FROM chime_workers WHERE id = $1",
                                 worker_id) is not None
