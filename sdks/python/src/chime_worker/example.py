"""An example worker with a few jobs: `python -m chime_worker.example [group]`.

Settings from the environment: CHIME_DATABASE_URL, CHIME_AMQP_URL, CHIME_QUEUE_PREFIX,
CHIME_GROUP (or the first argument; default `examples`), CHIME_WORKER_ID, CHIME_CAPACITY,
CHIME_HOLD, and CHIME_DRAIN_TIMEOUT (seconds). Add a job with one more `@worker.handler`
function in `build()`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from dataclasses import dataclass

from . import Cancel, Context, Fail, Retry, Worker


@dataclass
class Sleep:
    seconds: float = 1.0
    log_every: float = 0.0


@dataclass
class Flaky:
    fail_attempts: int = 1
    after: float | None = None


def build(group: str | None = None) -> Worker:
    drain = float(os.environ.get("CHIME_DRAIN_TIMEOUT") or 30)
    worker = Worker(group, drain_timeout=drain)

    @worker.handler("echo")
    async def echo(ctx: Context, params: object) -> None:
        """Logs its params and succeeds."""
        ctx.log.info(f"echo run {ctx.run_id} attempt {ctx.attempt}: {params!r}")

    @worker.handler("sleep", params=Sleep)
    async def sleep(ctx: Context, p: Sleep) -> None:
        """Sleeps `seconds`, logging every `log_every` seconds; stops early when cancelled."""
        ctx.log.info(f"sleeping {p.seconds}s")
        loop = asyncio.get_running_loop()
        end = loop.time() + p.seconds
        while (left := end - loop.time()) > 0:
            step = min(left, p.log_every) if p.log_every > 0 else left
            if await ctx.wait_cancelled(step):
                ctx.log.warn("cancelled while sleeping")
                raise Cancel("cancelled while sleeping")
            if p.log_every > 0 and end - loop.time() > 0:
                ctx.log.info("still sleeping")
        ctx.log.info("slept")

    @worker.handler("flaky", params=Flaky)
    async def flaky(ctx: Context, p: Flaky) -> None:
        """Fails retryably on its first `fail_attempts` attempts (after `after` s if given)."""
        if ctx.attempt <= p.fail_attempts:
            raise Retry(f"flaky failure on attempt {ctx.attempt}", after=p.after)
        ctx.log.info(f"succeeded on attempt {ctx.attempt}")

    @worker.handler("reject")
    async def reject(ctx: Context, params: object) -> None:
        """Fails for good (no retry)."""
        raise Fail(f"rejected: {params!r}")

    @worker.handler("crash")
    async def crash(ctx: Context, params: object) -> None:
        """Raises an ordinary exception: a retryable failure."""
        raise RuntimeError("the example crashed on purpose")

    return worker


def main() -> None:
    logging.basicConfig(level=os.environ.get("CHIME_LOG", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    worker = build(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("CHIME_GROUP")
                   or "examples")
    asyncio.run(worker.run_until_signal())


if __name__ == "__main__":
    main()
