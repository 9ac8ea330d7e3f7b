"""An example worker with a few jobs: `python -m chime_worker.example [group]`.

Settings from the environment: CHIME_DATABASE_URL, CHIME_AMQP_URL, CHIME_QUEUE_PREFIX,
CHIME_GROUP (or the first argument; default `examples`), CHIME_WORKER_ID, CHIME_CAPACITY,
CHIME_HOLD, and CHIME_DRAIN_TIMEOUT (seconds). Add a job with one more `@worker.handler`
function in `build()`. `shard-echo` is a sharded job's handler and `word-count` a map/reduce
job's handler and reducer (their job files set `kind`).
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

    @worker.handler("shard-echo")
    async def shard_echo(ctx: Context, params: object) -> None:
        """A sharded job's shard (`kind = "sharded"`): logs its place in the run."""
        if ctx.shard is None:
            raise Fail("shard-echo is a sharded job: set kind = \"sharded\" and shards = N in "
                       "its job file")
        ctx.log.info(f"shard {ctx.shard.index} of {ctx.shard.total} (param "
                     f"{ctx.shard.param!r}) of run {ctx.parent_run_id}: {params!r}")
        await ctx.set_output({"shard": ctx.shard.index})

    @worker.handler("word-count")
    async def word_count(ctx: Context, params: object) -> None:
        """A map/reduce job (`kind = "map_reduce"`): the root maps each text of
        `params["texts"]` to a sub-task, which counts its words."""
        if ctx.task is None:
            raise Fail("word-count is a map/reduce job: set kind = \"map_reduce\" in its job "
                       "file")
        if ctx.task.kind == "root":
            texts = params.get("texts", []) if isinstance(params, dict) else []
            mapped = await ctx.map("count", [str(t) for t in texts])
            ctx.log.info(f"mapped {mapped} texts")
        else:
            await ctx.set_output(len(str(params).split()))

    @worker.reducer("word-count")
    async def word_total(ctx: Context, params: object) -> None:
        """Sums the counts of every sub-task that succeeded."""
        words = 0
        async for r in ctx.results():
            if r.kind == "map" and r.state == "succeeded" and isinstance(r.output, int):
                words += r.output
        ctx.log.info(f"{words} words")
        await ctx.set_output({"words": words})

    return worker


def main() -> None:
    logging.basicConfig(level=os.environ.get("CHIME_LOG", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    worker = build(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("CHIME_GROUP")
                   or "examples")
    asyncio.run(worker.run_until_signal())


if __name__ == "__main__":
    main()
