"""Chime worker SDK for Python: run Chime jobs in an asyncio service.

    from chime_worker import Worker, Context, Retry, Fail, Cancel

    worker = Worker("orders")             # the group; connections from CHIME_* env vars

    @worker.handler("close-unpaid-orders")
    async def close_unpaid(ctx: Context, params: dict) -> None:
        ctx.log.info(f"closing up to {params['batch']} orders (run {ctx.run_id})")

    asyncio.run(worker.run_until_signal())

The wire protocol is docs/protocol.md of the Chime repository; this package follows it as a
peer of the Rust SDK.
"""

from .client import Client, Triggered
from .context import Context, JobLogger, LogLine
from .errors import Cancel, ConfigError, Fail, JobError, Retry
from .outcome import Outcome
from .protocol import PROTOCOL_VERSION, Shard, Task
from .tasks import TaskCallError, TaskResult, Upstream
from .worker import Worker

__all__ = ["Cancel", "Client", "ConfigError", "Context", "Fail", "JobError", "JobLogger",
           "LogLine", "Outcome", "PROTOCOL_VERSION", "Retry", "Shard", "Task", "TaskCallError",
           "TaskResult", "Triggered", "Upstream", "Worker"]
__version__ = "0.1.0"
