"""Fixtures: a fresh database with Chime's migrations and a fresh queue prefix per test.

Every test gets its own database (`chime_py_<random>`, a copy of one migrated once per session;
both dropped at the end) and its own queue
prefix (its queues and exchanges deleted at the end), against the real PostgreSQL and RabbitMQ
(CHIME_TEST_PG_ADMIN_URL / CHIME_TEST_AMQP_URL, default 127.0.0.1 with postgres and
guest/guest).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import aio_pika
import asyncpg
import pytest

from chime_worker import Worker
from chime_worker.broker import declare_base
from chime_worker.protocol import RETRY_TIERS, Topology, ms_of, rfc3339

ADMIN_URL = os.environ.get("CHIME_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
AMQP_URL = os.environ.get("CHIME_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
MIGRATIONS = Path(__file__).resolve().parents[3] / "migrations"
T = TypeVar("T")


async def wait_for(what: str, check: Callable[[], Awaitable[T | None]], timeout: float = 15.0,
                   every: float = 0.05) -> T:
    """Polls `check` until it returns something truthy, or fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = await check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        await asyncio.sleep(every)


def jsonb(value: Any) -> Any:
    """A jsonb column as the test pool returns it (its text), decoded."""
    return json.loads(value) if isinstance(value, str) else value


@dataclass
class Env:
    """One test's database, broker prefix and group, with helpers that act as the scheduler."""

    db: asyncpg.Pool
    db_url: str
    amqp: aio_pika.abc.AbstractRobustConnection
    prefix: str
    group: str
    topology: Topology
    workers: list[tuple[Worker, asyncio.Task[None]]] = field(default_factory=list)
    #: Every worker id started (their own queues are deleted at the end).
    worker_ids: list[str] = field(default_factory=list)
    _job: str = ""
    _parent: int = 0
    _at: datetime | None = None

    async def insert_job(self, name: str, retry: dict[str, Any] | None = None,
                         group: str | None = None) -> None:
        """A job whose `retry` is given as a trigger's `retry` object (`initial_ms`, `max_ms`,
        …) and stored in the job file's form (`initial = "<n>ms"`), as the scheduler stores it:
        the run's retry-policy snapshot, which `chime_retry_decision` reads, comes from it."""
        spec: dict[str, Any] = {"every": "1h"}
        if retry is not None:
            stored = {k: v for k, v in retry.items() if k not in ("initial_ms", "max_ms")}
            for key in ("initial", "max"):
                if f"{key}_ms" in retry:
                    stored[key] = f"{retry[f'{key}_ms']}ms"
            spec["retry"] = stored
        await self.db.execute(
            "INSERT INTO chime_jobs (name, group_name, spec) VALUES ($1, $2, $3::jsonb)",
            name, group or self.group, json.dumps(spec))

    async def insert_kind_job(self, name: str, kind: str, **spec: Any) -> None:
        """A job of kind `kind` (`broadcast`, `sharded`, `map_reduce`) with the job file's
        other keys (`shards`, `shard_params`, `min_workers`, `retry`, ...) as given."""
        await self.db.execute(
            "INSERT INTO chime_jobs (name, group_name, spec) VALUES ($1, $2, $3::jsonb)",
            name, self.group, json.dumps({"every": "1h", "kind": kind, "name": name,
                                          "group": self.group, **spec}))

    async def expand(self, job: str, params: Any = None) -> tuple[int, list[asyncpg.Record]]:
        """As the leader does at a fire of `job`: a pending parent run, expanded under the
        lease (`chime_expand_run`); returns the parent's id and its tasks to publish."""
        at = datetime.now(timezone.utc)
        parent = await self.insert_run(job, params, at, state="pending")
        await self.db.execute("UPDATE chime_leader SET holder = 't', term = 1, "
                              "expires_at = now() + interval '1 hour' WHERE name = 'default'")
        rows = await self.db.fetch("SELECT * FROM chime_expand_run('t', 1, $1)", parent)
        return parent, list(rows)

    async def task_row(self, task_id: int) -> asyncpg.Record:
        row = await self.db.fetchrow("SELECT * FROM chime_runs WHERE id = $1", task_id)
        assert row is not None
        return row

    def task_body(self, task: asyncpg.Record, *, worker: str | None = None,
                  attempt: int = 1) -> bytes:
        """The trigger of task row `task` (a chime_runs row or a chime_expand_run row) with
        its `task` object, as the leader publishes it; `worker` overrides a broadcast's."""
        row = dict(task)
        body = json.loads(self.trigger_body(row["id"], row.get("job_name") or self._job,
                                            jsonb(row["params"]), attempt=attempt,
                                            scheduled_at=self._at))
        t: dict[str, Any] = {"parent_run_id": self._parent, "key": row["task_key"],
                             "kind": row["task_kind"]}
        if row["shard_index"] is not None:
            t["shard"] = {"index": row["shard_index"], "total": row["shard_total"]}
            if row["shard_param"] is not None:
                t["shard"]["param"] = jsonb(row["shard_param"])
        if worker is not None or row["target_worker"] is not None:
            t["worker"] = worker or row["target_worker"]
        if row["map_step"] is not None:
            t["step"] = row["map_step"]
        if row["map_depth"] is not None:
            t["depth"] = row["map_depth"]
        body["task"] = t
        return json.dumps(body).encode()

    async def publish_tasks(self, job: str, parent: int, tasks: list[asyncpg.Record],
                            routing_key: str | None = None) -> None:
        """Publishes the triggers of `tasks` of run `parent` as the leader does: a broadcast
        task with key `worker.<id>`, any other with `work` (or all with `routing_key`)."""
        self._job = job
        self._parent = parent
        self._at = await self.db.fetchval("SELECT scheduled_at FROM chime_runs WHERE id = $1",
                                          parent)
        for t in tasks:
            key = routing_key or (self.topology.worker_key(t["target_worker"])
                                  if t["target_worker"] else "work")
            await self.publish(self.task_body(t), run_id=t["id"], scheduled_at=self._at,
                               not_before=False, routing_key=key)

    async def pending_tasks(self, parent: int, kind: str) -> list[asyncpg.Record]:
        """Run `parent`'s tasks of `kind` the outbox would publish (pending, in id order)."""
        return list(await self.db.fetch(
            "SELECT * FROM chime_runs WHERE parent_id = $1 AND task_kind = $2 "
            "AND state = 'pending' ORDER BY id", parent, kind))

    async def insert_run(self, job: str, params: Any = None, scheduled_at: datetime | None = None,
                         state: str = "queued", group: str | None = None) -> int:
        return int(await self.db.fetchval(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state) "
            "VALUES ($1, $2, $3, 'manual', $4::jsonb, $5) RETURNING id",
            job, group or self.group, scheduled_at or datetime.now(timezone.utc),
            json.dumps(params), state))

    def trigger_body(self, run_id: int, job: str, params: Any = None, attempt: int = 1,
                     scheduled_at: datetime | None = None, timeout_ms: int | None = None,
                     retry: dict[str, Any] | None = None, group: str | None = None) -> bytes:
        body: dict[str, Any] = {
            "v": 1, "run_id": run_id, "job": job, "group": group or self.group,
            "attempt": attempt,
            "scheduled_at": rfc3339(scheduled_at or datetime.now(timezone.utc)),
            "params": params,
        }
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        if retry is not None:
            body["retry"] = retry
        return json.dumps(body).encode()

    async def publish(self, body: bytes, *, run_id: int | None, attempt: int = 1,
                      scheduled_at: datetime | None = None,
                      not_before: int | None | bool = True,
                      headers: dict[str, Any] | None = None,
                      message_id: str | None = None, routing_key: str = "work") -> None:
        """Publishes as the scheduler does (docs/protocol.md section 2): to `P.G` with key
        `work`, mandatory, confirmed, persistent; `x-chime-not-before` = the scheduled instant
        unless `not_before` says otherwise."""
        at = scheduled_at or datetime.now(timezone.utc)
        h: dict[str, Any] = {"x-chime-attempt": attempt, "x-chime-term": 1}
        if not_before is True:
            h["x-chime-not-before"] = ms_of(at)
        elif isinstance(not_before, int) and not isinstance(not_before, bool):
            h["x-chime-not-before"] = not_before
        h.update(headers or {})
        async with self.amqp.channel(publisher_confirms=True, on_return_raises=True) as ch:
            exchange = await ch.get_exchange(self.topology.exchange)
            await exchange.publish(aio_pika.Message(
                body, content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                message_id=message_id if run_id is None else str(run_id),
                timestamp=int(at.timestamp()), headers=h), routing_key, mandatory=True)

    async def trigger(self, job: str, params: Any = None, **kw: Any) -> int:
        """Inserts a run and publishes its first trigger; returns the run id."""
        at = kw.pop("scheduled_at", None) or datetime.now(timezone.utc)
        run_id = await self.insert_run(job, params, at)
        await self.publish(self.trigger_body(run_id, job, params, scheduled_at=at, **kw),
                           run_id=run_id, scheduled_at=at)
        return run_id

    async def get_message(self, queue: str, timeout: float = 15.0
                          ) -> aio_pika.abc.AbstractIncomingMessage:
        """Waits for a message in `queue` and takes it. The queue may not be declared yet,
        or be a quorum queue just declared whose replica is not up (the broker then closes
        the connection with INTERNAL_ERROR): a poll that fails opens a new connection."""
        conn: aio_pika.abc.AbstractConnection | None = None

        async def one() -> aio_pika.abc.AbstractIncomingMessage | None:
            nonlocal conn
            try:
                if conn is None or conn.is_closed:
                    conn = await aio_pika.connect(AMQP_URL)
                async with conn.channel() as ch:
                    q = await ch.declare_queue(queue, passive=True)
                    return await q.get(no_ack=True, fail=False)
            except (aio_pika.exceptions.AMQPError, ConnectionError, RuntimeError):
                # RuntimeError: aio-pika's "connection closed" when the broker closed it
                # between the check above and the channel's opening. Start afresh next poll.
                conn = None
                return None

        try:
            return await wait_for(f"a message in {queue}", one, timeout)
        finally:
            if conn is not None and not conn.is_closed:
                await conn.close()

    async def run_state(self, run_id: int) -> str:
        return str(await self.db.fetchval("SELECT state FROM chime_runs WHERE id = $1", run_id))

    async def wait_run(self, run_id: int, *states: str, timeout: float = 15.0) -> asyncpg.Record:
        async def check() -> asyncpg.Record | None:
            row = await self.db.fetchrow("SELECT * FROM chime_runs WHERE id = $1", run_id)
            return row if row is not None and row["state"] in states else None

        return await wait_for(f"run {run_id} in {states}", check, timeout)

    async def attempts(self, run_id: int) -> list[asyncpg.Record]:
        return list(await self.db.fetch(
            "SELECT * FROM chime_attempts WHERE run_id = $1 ORDER BY attempt", run_id))

    async def start_worker(self, worker: Worker) -> Worker:
        task = asyncio.create_task(worker.run())
        self.workers.append((worker, task))
        self.worker_ids.append(worker.worker_id)

        async def registered() -> bool:
            if task.done():
                task.result()
            return bool(await self.db.fetchval(
                "SELECT count(*) FROM chime_workers WHERE id = $1", worker.worker_id))

        await wait_for("the worker to register", registered)
        return worker

    def worker(self, **kw: Any) -> Worker:
        return Worker(self.group, database_url=self.db_url, amqp_url=AMQP_URL,
                      prefix=self.prefix, worker_id=f"py-{secrets.token_hex(3)}",
                      heartbeat_interval=0.2, **kw)

    async def stop_workers(self) -> None:
        for worker, task in self.workers:
            worker.stop()
        for worker, task in self.workers:
            await asyncio.wait_for(task, 60)
        self.workers.clear()


def _db_url(name: str) -> str:
    return ADMIN_URL.rsplit("/", 1)[0] + "/" + name


#: A database with the migrations applied, made once per test session; each test's database
#: is a copy of it (CREATE DATABASE ... TEMPLATE), dropped at the end.
_template: str | None = None


async def _migrated_template(admin: asyncpg.Connection) -> str:
    global _template
    if _template is None:
        name = f"chime_py_template_{secrets.token_hex(6)}"
        await admin.execute(f'CREATE DATABASE "{name}"')
        conn = await asyncpg.connect(_db_url(name))
        try:
            for path in sorted(MIGRATIONS.glob("*.sql")):
                await conn.execute(path.read_text())
        finally:
            await conn.close()
        _template = name
    return _template


@pytest.fixture(scope="session", autouse=True)
def _drop_template() -> Any:
    yield
    if _template is not None:
        async def drop() -> None:
            admin = await asyncpg.connect(ADMIN_URL)
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{_template}" WITH (FORCE)')
            finally:
                await admin.close()

        asyncio.run(drop())


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    name = f"chime_py_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(ADMIN_URL)
    template = await _migrated_template(admin)
    await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    db_url = _db_url(name)
    pool = None
    amqp = None
    e: Env | None = None
    prefix = f"chimepy{secrets.token_hex(4)}"
    group = "g" + secrets.token_hex(3)
    topology = Topology(prefix, group)
    try:
        pool = await asyncpg.create_pool(db_url, min_size=1, max_size=4)
        assert pool is not None
        amqp = await aio_pika.connect_robust(AMQP_URL)
        async with amqp.channel() as ch:
            await declare_base(ch, topology)  # as the scheduler does at start
        e = Env(pool, db_url, amqp, prefix, group, topology)
        try:
            yield e
        finally:
            await e.stop_workers()
    finally:
        if amqp is not None:
            await amqp.close()
        # On a connection of its own: the test's may have been closed by the broker.
        cleanup = await aio_pika.connect(AMQP_URL)
        try:
            async with cleanup.channel() as ch:
                own = [] if e is None else [topology.worker_queue(w) for w in e.worker_ids]
                for q in [topology.work_queue, topology.parking_queue,
                          *(topology.retry_queue(t) for t in RETRY_TIERS), *own]:
                    await ch.queue_delete(q)
                await ch.exchange_delete(topology.exchange)
                await ch.exchange_delete(topology.control_exchange)
        finally:
            await cleanup.close()
        if pool is not None:
            await pool.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


class LogCapture(logging.Handler):
    """The SDK's own log records, to wait for a message such as 'acked without running'."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def sdk_log() -> Any:
    capture = LogCapture()
    logger = logging.getLogger("chime_worker")
    logger.addHandler(capture)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    yield capture
    logger.removeHandler(capture)
    logger.setLevel(old)


def later(seconds: float) -> datetime:
    return datetime.now(timezone.utc) + timedelta(seconds=seconds)
