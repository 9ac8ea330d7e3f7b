"""The bench worker: `python -m chime_worker.bench`, for `chime-bench --worker-cmd`.

Follows the bench worker environment of the repository's docs/benchmarks.md ("Any worker"):
CHIME_DATABASE_URL, CHIME_AMQP_URL, CHIME_QUEUE_PREFIX, CHIME_GROUP, CHIME_WORKER_ID,
CHIME_CAPACITY and CHIME_HOLD as for any worker, and CHIME_JOBS, the job names (comma-separated)
whose handlers succeed at once, so that what is measured is the SDK's path (claim, start, record,
ack), not a handler. Runs until SIGTERM or SIGINT, then drains.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys
from typing import Any, Callable

from . import Context, Worker

MAX_JOBS = 100_000
"""At most this many job names in CHIME_JOBS."""


async def _succeed(ctx: Context, params: object) -> None:
    """A handler that succeeds at once."""


def build() -> Worker:
    """A worker handling every job of CHIME_JOBS with a handler that succeeds at once."""
    names = [name for name in os.environ.get("CHIME_JOBS", "").split(",") if name]
    if not names:
        raise SystemExit("chime_worker.bench: CHIME_JOBS names no job; set it to the job "
                         "names to handle, comma-separated")
    if len(names) > MAX_JOBS:
        raise SystemExit(f"chime_worker.bench: CHIME_JOBS names {len(names)} jobs, over the "
                         f"limit of {MAX_JOBS}")
    worker = Worker(os.environ.get("CHIME_GROUP"), drain_timeout=10)
    for name in names:
        worker.handle(name, _succeed)
    return worker


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (the `fast` extra) and CHIME_UVLOOP is not
    0, else None (asyncio's own)."""
    if os.environ.get("CHIME_UVLOOP", "1") == "0":
        return None
    try:
        uvloop: Any = importlib.import_module("uvloop")
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main() -> None:
    logging.basicConfig(level=os.environ.get("CHIME_LOG", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s",
                        stream=sys.stderr)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(build().run_until_signal())


if __name__ == "__main__":
    main()
