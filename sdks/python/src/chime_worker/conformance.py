"""The conformance worker: `python -m chime_worker.conformance`, for `chime-conformance`.

Handles the five jobs of the repository's docs/conformance.md ("What a worker must handle") with
this SDK, configured by the environment the suite gives every worker: CHIME_DATABASE_URL,
CHIME_AMQP_URL, CHIME_QUEUE_PREFIX, CHIME_GROUP and CHIME_WORKER_ID. Runs until SIGTERM or
SIGINT, then drains.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from dataclasses import dataclass

from . import Cancel, Context, Fail, Retry, Worker


@dataclass
class Ok:
    tag: str = ""


@dataclass
class Sleep:
    seconds: float = 0.0


@dataclass
class Failing:
    fails: int = 0


@dataclass
class Lines:
    lines: int = 0
    every: float = 0.0


def build() -> Worker:
    """A worker of CHIME_GROUP with the conformance jobs."""
    worker = Worker(os.environ.get("CHIME_GROUP"))

    @worker.handler("conf-ok", params=Ok)
    async def conf_ok(ctx: Context, p: Ok) -> None:
        ctx.log.info(f"ok {p.tag}")

    @worker.handler("conf-sleep", params=Sleep)
    async def conf_sleep(ctx: Context, p: Sleep) -> None:
        ctx.log.info("sleeping")
        if await ctx.wait_cancelled(p.seconds):
            raise Cancel("cancelled while sleeping")

    @worker.handler("conf-fail", params=Failing)
    async def conf_fail(ctx: Context, p: Failing) -> None:
        if ctx.attempt <= p.fails:
            raise Retry(f"failing on attempt {ctx.attempt} of the first {p.fails}")

    @worker.handler("conf-fatal")
    async def conf_fatal(ctx: Context, params: object) -> None:
        raise Fail("fatal on purpose")

    @worker.handler("conf-log", params=Lines)
    async def conf_log(ctx: Context, p: Lines) -> None:
        for i in range(1, p.lines + 1):
            if i > 1 and await ctx.wait_cancelled(p.every):
                raise Cancel(f"cancelled after line {i - 1}")
            ctx.log.info(f"line {i}")

    return worker


def main() -> None:
    logging.basicConfig(level=os.environ.get("CHIME_LOG", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s",
                        stream=sys.stderr)
    asyncio.run(build().run_until_signal())


if __name__ == "__main__":
    main()
