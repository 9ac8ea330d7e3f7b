"""The worker: register handlers, consume the group's work queue, run, record, drain.

One delivery's path, in the order of docs/protocol.md section 4: decode and check (forward
another worker's broadcast task to its queue), find the handler (or send the trigger back for
another worker), hold an early trigger, claim the attempt (or take a lost worker's run over),
run the handler under its timeout and cancellation, decide, record the outcome with the
remaining log lines, then publish the retry, park, or ack.

The worker consumes two queues the same way: the group's work queue and its own queue
`P.G.worker.<id>` (the broadcast tasks for it, docs/protocol.md "Job kinds and tasks").
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import os
import re
import secrets
import signal
import socket
import time
import typing
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Awaitable, Callable, Coroutine, TypeVar

from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from .batching import Collector, Failed
from .broker import Broker, PublishFailed
from .context import Context, JobLogger, LogLine
from .errors import Cancel, ConfigError, Fail
from .outcome import Execution, Outcome, outcome
from .protocol import (DEFAULT_DELIVERY_LIMIT, DEFAULT_PREFIX, HEADER_ATTEMPT,
                       HEADER_DELIVERY_COUNT, HEADER_NOT_BEFORE, HOLD_MAX_MS, IMPLAUSIBLE,
                       MAX_NAME_BYTES, MAX_QUEUE_NAME_BYTES, MAX_UNHANDLED_WAIT_MS, RETRY_TIERS,
                       TRIGGER_HOLD_MAX_MS, WORK_KEY, DecodeError, Tier, Topology, Trigger,
                       check_trigger, decode_trigger, from_ms, header_int, ms_of, plan_wait,
                       quote, rfc3339, tier_for, unhandled_pause)
from .secret_file import value_or_file
from .store import Claim, ClaimRequest, OutcomeRow, Snapshot, Store, create_pool
from .tasks import TaskCallError, TaskResult, Upstream

log = logging.getLogger("chime_worker")

ENV_DATABASE_URL = "CHIME_DATABASE_URL"
ENV_AMQP_URL = "CHIME_AMQP_URL"
ENV_QUEUE_PREFIX = "CHIME_QUEUE_PREFIX"
ENV_GROUP = "CHIME_GROUP"
ENV_WORKER_ID = "CHIME_WORKER_ID"
ENV_CAPACITY = "CHIME_CAPACITY"
ENV_HOLD = "CHIME_HOLD"
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chime"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"
DEFAULT_CAPACITY = 8
DEFAULT_HOLD = 256
DEFAULT_DRAIN_TIMEOUT = 30.0
DEFAULT_CANCEL_GRACE = 5.0
DEFAULT_HEARTBEAT_INTERVAL = 0.5
DEFAULT_ACK_AFTER = 600.0
DEFAULT_UNHANDLED_WAIT = 300.0
DEFAULT_DB_RETRY_BUDGET = 30.0
#: Pause before requeueing a delivery whose publish or database write failed.
REQUEUE_PAUSE = 1.0
WAITING = ("pending", "queued", "retrying")
LISTED_JOBS = 20
#: Names of groups and the queue prefix (docs/configuration.md, "Names").
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")

Handler = Callable[[Context, Any], Awaitable[None]]
H = TypeVar("H", bound=Handler)


@dataclass
class _Registered:
    fn: Handler
    params: type | None


@dataclass
class _Active:
    """A run this worker holds a delivery of."""

    attempt: int
    #: The run this task belongs to (a cancel naming it cancels the task); None: a single run.
    parent_run_id: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_requested: bool = False
    interrupted: bool = False
    #: The attempt this worker claimed and has not recorded yet.
    claimed: int | None = None
    #: Called by `cancel()` (what waits for a cancellation without a task).
    hooks: list[Callable[[], None]] = field(default_factory=list)

    def cancel(self) -> None:
        """Signals the cancellation (the handler's `ctx.cancelled`, and every hook)."""
        self.cancelled.set()
        hooks, self.hooks = self.hooks, []
        for hook in hooks:
            hook()

    def on_cancel(self, hook: Callable[[], None]) -> None:
        """Calls `hook` at the cancellation (at once if it was signalled already)."""
        if self.cancelled.is_set():
            hook()
        else:
            self.hooks.append(hook)

    def cancellation(self) -> asyncio.Future[None]:
        """A future done when the run is cancelled."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.on_cancel(lambda: _resolve(waiter))
        return waiter


class _Slots:
    """The handler slots. A delivery asks for one when it is due (at once, or from a timer at
    its instant, or at its cancellation), and only a delivery given a slot is woken: hundreds
    due at one instant cost a callback each, not a wake-up each to wait for a slot again.
    Slots go in the order deliveries became due."""

    def __init__(self, capacity: int) -> None:
        self.free = capacity
        self._due: collections.deque[asyncio.Future[None]] = collections.deque()

    def due(self, granted: asyncio.Future[None]) -> None:
        """Resolves `granted` when a slot is this delivery's."""
        if self.free > 0 and not self._due:
            self.free -= 1
            granted.set_result(None)
        else:
            self._due.append(granted)

    def release(self) -> None:
        while self._due:
            granted = self._due.popleft()
            if not granted.done():  # not given up (its task cancelled)
                granted.set_result(None)
                return
        self.free += 1

    async def take(self, active: _Active, starts_at: datetime | None) -> None:
        """Waits until the delivery is due (at `starts_at` on the wall clock, or at its
        cancellation) and a slot is free; the caller releases the slot."""
        loop = asyncio.get_running_loop()
        granted: asyncio.Future[None] = loop.create_future()
        asked = False
        timer: asyncio.TimerHandle | None = None

        def ask() -> None:
            nonlocal asked
            if not asked:
                asked = True
                self.due(granted)

        def at_instant() -> None:
            # The loop's timers may fire up to a clock tick early (uvloop: 1 ms): a handler
            # never starts before its instant, so look at the wall clock again.
            nonlocal timer
            assert starts_at is not None
            left = (starts_at - datetime.now(timezone.utc)).total_seconds()
            if left > 0:
                timer = loop.call_later(left, at_instant)
            else:
                ask()

        if starts_at is not None and not active.cancelled.is_set():
            at_instant()
            active.on_cancel(ask)
        else:
            ask()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release()  # given, then cancelled before it woke
            raise
        finally:
            if timer is not None:
                timer.cancel()


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value else None


def _env_int(name: str, default: int, low: int, high: int) -> int:
    raw = _env(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer: set it to a number from {low} "
                          f"to {high}") from None
    return value


def _bounded(name: str, value: float, low: float, high: float, fix: str = "") -> None:
    if not (low <= value <= high):
        raise ConfigError(f"{name} is {value}, outside {low}..={high}{fix}")


def decode_params(params: Any, cls: type | None, job: str = "") -> Any:
    """The trigger's JSON params as `cls` (a dataclass, whose fields of plain types (int,
    float, str, bool, list, dict) are type-checked; or any type called with the object's keys),
    or unchanged without a type; raises Fail naming the problem when they do not fit."""
    if cls is None:
        return params
    try:
        if not isinstance(params, dict):
            raise TypeError(f"expected a JSON object, got {json.dumps(params)[:80]}")
        if dataclasses.is_dataclass(cls):
            hints = typing.get_type_hints(cls)
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(params) - names)
            if unknown:
                raise TypeError(f"unknown field(s) {', '.join(unknown)}")
            for name, value in params.items():
                want = hints.get(name)
                if want is float and isinstance(value, int) and not isinstance(value, bool):
                    continue
                if want in (int, float, str, bool, list, dict) and (
                        not isinstance(value, want) or (want is int and isinstance(value, bool))):
                    raise TypeError(f"field `{name}`: invalid type: {json.dumps(value)[:80]}, "
                                    f"expected {want.__name__}")
        return cls(**params)
    except (TypeError, ValueError) as e:
        raise Fail(f"params of job `{job}` do not decode into {cls.__name__}: {e}") from None


class Worker:
    """A Chime worker of one executor group.

    Settings not given here come from the environment (`CHIME_DATABASE_URL`, `CHIME_AMQP_URL`,
    `CHIME_QUEUE_PREFIX`, `CHIME_GROUP`, `CHIME_WORKER_ID`, `CHIME_CAPACITY`, `CHIME_HOLD`),
    else the defaults of the Rust SDK. `CHIME_DATABASE_URL_FILE` and `CHIME_AMQP_URL_FILE`
    may instead name a file holding the URL (a mounted secret; `chime_worker.secret_file`).
    """

    def __init__(
        self,
        group: str | None = None,
        *,
        database_url: str | None = None,
        amqp_url: str | None = None,
        prefix: str | None = None,
        worker_id: str | None = None,
        capacity: int | None = None,
        hold: int | None = None,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
        cancel_grace: float = DEFAULT_CANCEL_GRACE,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        ack_after: float = DEFAULT_ACK_AFTER,
        unhandled_wait: float = DEFAULT_UNHANDLED_WAIT,
        delivery_limit: int = DEFAULT_DELIVERY_LIMIT,
        db_retry_budget: float = DEFAULT_DB_RETRY_BUDGET,
    ) -> None:
        group = group or _env(ENV_GROUP)
        if not group:
            raise ConfigError(f"no executor group: pass Worker(group=...) or set {ENV_GROUP}")
        self.group = group
        # The environment (or the file its `_FILE` names) only when no URL is given here: a
        # URL in code wins, and a bad secret file it replaces is not read.
        self.database_url = (database_url or value_or_file(ENV_DATABASE_URL)
                             or DEFAULT_DATABASE_URL)
        self.amqp_url = amqp_url or value_or_file(ENV_AMQP_URL) or DEFAULT_AMQP_URL
        self.prefix = prefix or _env(ENV_QUEUE_PREFIX) or DEFAULT_PREFIX
        for what, name in (("group", group), ("queue prefix", self.prefix)):
            if not _NAME.fullmatch(name):
                raise ConfigError(f"{what} {name[:80]!r} is not a Chime name: use 1 to "
                                  f"{MAX_NAME_BYTES} characters from a-z, 0-9, '_', '.' and "
                                  "'-', starting with a letter or digit")
        self.hostname = socket.gethostname()
        self.worker_id = (worker_id or _env(ENV_WORKER_ID)
                          or f"{self.hostname}-{os.getpid()}-{secrets.token_hex(3)}")
        self.capacity = capacity if capacity is not None else _env_int(
            ENV_CAPACITY, DEFAULT_CAPACITY, 1, 65535)
        self.hold = hold if hold is not None else _env_int(ENV_HOLD, DEFAULT_HOLD, 0, 65535)
        _bounded("capacity", self.capacity, 1, 65535, f" (set {ENV_CAPACITY} or capacity=)")
        _bounded("hold", self.hold, 0, 65535, f" (set {ENV_HOLD} or hold=)")
        _bounded("capacity + hold (the prefetch)", self.capacity + self.hold, 1, 65535,
                 ": AMQP's prefetch count is 16-bit; lower hold or capacity")
        _bounded("drain_timeout", drain_timeout, 0, 86400)
        _bounded("cancel_grace", cancel_grace, 0, 3600)
        _bounded("heartbeat_interval", heartbeat_interval, 0.05, 60)
        _bounded("ack_after", ack_after, 1, 86400)
        _bounded("unhandled_wait", unhandled_wait, 0, MAX_UNHANDLED_WAIT_MS / 1000)
        _bounded("delivery_limit", delivery_limit, 1, 2**32 - 1)
        self.drain_timeout = drain_timeout
        self.cancel_grace = cancel_grace
        self.heartbeat_interval = heartbeat_interval
        self.ack_after = ack_after
        self.unhandled_wait = unhandled_wait
        self.db_retry_budget = db_retry_budget
        self.topology = Topology(self.prefix, group, delivery_limit)
        self.handlers: dict[str, _Registered] = {}
        #: Map/reduce jobs' reducers: what runs a run's reduce task.
        self.reducers: dict[str, _Registered] = {}
        self._stop = asyncio.Event() if _loop_running() else None
        self._store: Store | None = None
        self._broker: Broker | None = None
        self._slots: _Slots | None = None
        self._active: dict[int, _Active] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._shutting_down = False
        self._interrupting = False
        self._openings = 0
        #: Claims and outcomes that arrive together go in one statement each
        #: (docs/protocol.md section 4, steps 4 and 7); set by `run()`.
        self._claims: Collector[ClaimRequest, Claim | None] | None = None
        self._outcomes: Collector[OutcomeRow, tuple[int, bool, str | None]] | None = None
        #: Outcomes that could not be written, by (run id, attempt): the delivery was
        #: requeued, and its redelivery writes them (docs/protocol.md section 4, step 8).
        self._kept: dict[tuple[int, int], tuple[Outcome, int, datetime, list[LogLine]]] = {}

    # ---- registration ------------------------------------------------------------------

    def handler(self, job: str, *, params: type | None = None) -> Callable[[H], H]:
        """Registers an async `fn(ctx, params)` for `job`; `params` optionally names the type
        the JSON params decode into (a dataclass, or any type taking them as keywords)."""
        if not job or len(job.encode()) > MAX_NAME_BYTES:
            raise ConfigError(f"job name {job!r} must be 1 to {MAX_NAME_BYTES} bytes")

        def register(fn: H) -> H:
            if job in self.handlers:
                raise ConfigError(f"job {job!r} already has a handler")
            untyped: Any = fn
            if not asyncio.iscoroutinefunction(untyped):
                raise ConfigError(f"the handler of {job!r} must be an async function")
            self.handlers[job] = _Registered(fn, params)
            return fn

        return register

    def handle(self, job: str, fn: Handler, *, params: type | None = None) -> None:
        """`handler(job)(fn)` without the decorator."""
        self.handler(job, params=params)(fn)

    def reducer(self, job: str, *, params: type | None = None) -> Callable[[H], H]:
        """Registers an async `fn(ctx, params)` as map_reduce job `job`'s reducer: it runs the
        run's reduce task once every other task has ended, reads their results with
        `ctx.results()`, and its outcome is the run's. `params` are the run's params (decoded
        as for a handler). The job's handler (`@worker.handler`) runs its other tasks."""
        if not job or len(job.encode()) > MAX_NAME_BYTES:
            raise ConfigError(f"job name {job!r} must be 1 to {MAX_NAME_BYTES} bytes")

        def register(fn: H) -> H:
            if job in self.reducers:
                raise ConfigError(f"job {job!r} already has a reducer")
            untyped: Any = fn
            if not asyncio.iscoroutinefunction(untyped):
                raise ConfigError(f"the reducer of {job!r} must be an async function")
            self.reducers[job] = _Registered(fn, params)
            return fn

        return register

    def reduce(self, job: str, fn: Handler, *, params: type | None = None) -> None:
        """`reducer(job)(fn)` without the decorator."""
        self.reducer(job, params=params)(fn)

    @property
    def store(self) -> Store:
        assert self._store is not None, "the worker is not running"
        return self._store

    @property
    def broker(self) -> Broker:
        assert self._broker is not None, "the worker is not running"
        return self._broker

    # ---- life --------------------------------------------------------------------------

    def stop(self) -> None:
        """Starts the graceful shutdown (what SIGTERM does)."""
        if self._stop is not None:
            self._stop.set()

    async def run_until_signal(self) -> None:
        """Runs until SIGTERM or SIGINT, then drains."""
        loop = asyncio.get_running_loop()
        self._stop = self._stop or asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        try:
            await self.run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    async def run(self) -> None:
        """Registers, consumes until `stop()`, drains, and marks the worker stopped."""
        if not self.handlers and not self.reducers:
            raise ConfigError("the worker has no handlers: register one with @worker.handler")
        self._stop = self._stop or asyncio.Event()
        self._slots = _Slots(self.capacity)
        pool = await create_pool(self.database_url, max_size=max(4, min(self.capacity + 4, 32)))
        self._store = Store(pool)
        store = self._store
        self._claims = Collector(
            "claim", lambda batch: store.claim_many(batch, self.worker_id, self.group),
            key=lambda c: c.run_id)
        self._outcomes = Collector(
            "outcome write", lambda rows: self._record_many(rows), key=lambda r: r.run_id)
        self._broker = Broker(self.amqp_url, self.topology, f"chime-worker-{self.worker_id}")
        heartbeat: asyncio.Task[None] | None = None
        try:
            await self._broker.connect()
            # Before registering: a broadcast expanded once this worker is online is routed
            # to this queue.
            await self._broker.declare_worker_queue(self.worker_id)
            await self.store.register(self.worker_id, self.group, self.hostname,
                                      self.capacity, self.jobs(),
                                      int(self.heartbeat_interval * 1000))
            heartbeat = asyncio.create_task(self._heartbeats())
            log.info("worker %s of group %s consuming %s and %s (capacity %d, hold %d)",
                     self.worker_id, self.group, self.topology.work_queue,
                     self.topology.worker_queue(self.worker_id), self.capacity, self.hold)
            await self._consume_until_stopped()
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
            try:
                await self._broker.close()
            except Exception as e:
                log.warning("closing the broker connection: %s", e)
            try:
                await self.store.stopped(self.worker_id)
            except Exception as e:
                log.warning("marking worker %s stopped: %s", self.worker_id, e)
            await pool.close()
            log.info("worker %s stopped", self.worker_id)

    def jobs(self) -> list[str]:
        """The jobs this worker handles (a handler or a reducer), as it registers them."""
        return sorted(set(self.handlers) | set(self.reducers))

    async def _consume_until_stopped(self) -> None:
        assert self._stop is not None
        connection = self.broker.connection
        assert connection is not None
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=self.capacity + self.hold)
        work = await channel.declare_queue(self.topology.work_queue, passive=True)
        tag = await work.consume(self._on_delivery, no_ack=False)
        # The worker's own queue: handled as the work queue's deliveries are. The prefetch
        # counts per consumer (quorum queues have no channel-wide prefetch).
        own = await channel.declare_queue(self.topology.worker_queue(self.worker_id),
                                          passive=True)
        own_tag = await own.consume(self._on_delivery, no_ack=False)
        control = await self._consume_control()
        await self._stop.wait()
        # 1. stop consuming; deliveries not claimed yet are requeued by their tasks.
        self._shutting_down = True
        log.info("worker %s draining %d deliveries", self.worker_id, len(self._tasks))
        try:
            await work.cancel(tag)
            await own.cancel(own_tag)
        except Exception as e:
            log.warning("cancelling the consumer failed (%s); closing its channel", e)
            try:
                await channel.close()
            except Exception:
                pass
        # 2. running handlers finish, up to the drain timeout.
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.drain_timeout)
        # 3. the rest are cancelled (an interruption), 4. recorded and acked.
        self._interrupting = True
        for active in self._active.values():
            active.interrupted = True
            active.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.cancel_grace + 60)
        try:
            await control.channel.close()
        except Exception:
            pass
        # 5. close (run() closes the connection and marks the worker stopped).
        if not channel.is_closed:
            await channel.close()

    async def _consume_control(self) -> AbstractQueue:
        connection = self.broker.connection
        assert connection is not None
        channel = await connection.channel()
        import aio_pika

        exchange = await channel.declare_exchange(self.topology.control_exchange,
                                                  aio_pika.ExchangeType.FANOUT, durable=True)
        self._openings += 1
        queue = await channel.declare_queue(
            f"{self.topology.control_exchange}.{self.worker_id}.{self._openings}",
            exclusive=True, auto_delete=True)
        await queue.bind(exchange, "")
        await queue.consume(self._on_control, no_ack=True)
        return queue

    async def _on_control(self, message: AbstractIncomingMessage) -> None:
        try:
            body = json.loads(message.body)
            run_id = body["cancel_run"]["run_id"]
            if isinstance(run_id, bool) or not isinstance(run_id, int):
                raise TypeError("run_id must be an integer")
        except (ValueError, KeyError, TypeError) as e:
            log.warning("ignoring a control message that does not decode (%s): %r", e,
                        message.body[:200])
            return
        # The run itself, or the tasks of the run it names (a parent's cancel is one message).
        for held_id, active in list(self._active.items()):
            if held_id != run_id and active.parent_run_id != run_id:
                continue
            if held_id == run_id:
                log.info("run %s: cancel requested by an operator", run_id)
            else:
                log.info("run %s: cancel of its run %s requested by an operator", held_id,
                         run_id)
            active.cancel_requested = True
            active.cancel()

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                await self.store.heartbeat(self.worker_id)
            except Exception as e:
                log.warning("heartbeat of worker %s failed: %s", self.worker_id, e)

    # ---- one delivery ------------------------------------------------------------------

    async def _on_delivery(self, message: AbstractIncomingMessage) -> None:
        task = asyncio.create_task(self._delivery(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delivery(self, message: AbstractIncomingMessage) -> None:
        try:
            await self._handle(message)
        except Exception as e:
            log.exception("delivery %s failed: %s; requeueing it", message.message_id, e)
            await self._requeue(message)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Runs `work` in a task the drain waits for."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _requeue(self, message: AbstractIncomingMessage, pause: float = REQUEUE_PAUSE
                       ) -> None:
        await asyncio.sleep(pause)
        try:
            await message.nack(requeue=True)
        except Exception as e:
            log.warning("requeueing delivery %s failed: %s", message.message_id, e)

    async def _ack(self, message: AbstractIncomingMessage) -> None:
        try:
            await message.ack()
        except Exception as e:  # the channel closed: the broker requeues it; the claim refuses
            log.warning("acking delivery %s failed: %s", message.message_id, e)

    async def _park(self, message: AbstractIncomingMessage, reason: str,
                    error: str | None = None) -> bool:
        """Parks and acks; on failure requeues after a pause. True when parked."""
        try:
            await self.broker.park(message, reason, self.worker_id, error)
        except PublishFailed as e:
            log.error("parking delivery %s failed (%s); requeueing it", message.message_id, e)
            await self._requeue(message)
            return False
        log.warning("parked delivery %s: %s", message.message_id, reason)
        await self._ack(message)
        return True

    async def _send_through(self, message: AbstractIncomingMessage, tier: Tier | None,
                            extra: dict[str, Any] | None = None,
                            body: bytes | None = None, due_key: str = WORK_KEY) -> None:
        """A confirmed copy through `tier` (None: straight to `due_key`, the work queue's),
        then ack; requeue on failure."""
        try:
            await self.broker.copy(message, tier.routing_key if tier else due_key,
                                   body=body, extra=extra)
        except PublishFailed as e:
            log.error("sending delivery %s through a delay tier failed (%s); requeueing it",
                      message.message_id, e)
            await self._requeue(message)
            return
        await self._ack(message)

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        headers = dict(message.headers or {})
        now = datetime.now(timezone.utc)
        # 1. decode and check.
        try:
            trigger = decode_trigger(message.body)
        except DecodeError as e:
            await self._park(message, str(e))
            return
        problem = check_trigger(trigger, group=self.group, headers=headers,
                                redelivered=bool(message.redelivered),
                                delivery_limit=self.topology.delivery_limit, now=now)
        if problem is not None:
            await self._park(message, problem)
            return
        if self._shutting_down:
            await message.nack(requeue=True)
            return
        task = trigger.task
        if task is not None and task.worker is not None and task.worker != self.worker_id:
            # Another worker's broadcast task (back from a delay tier through the work queue):
            # it runs there only.
            await self._forward(message, trigger, task.worker)
            return
        # One delivery per run at a time.
        active = self._active.get(trigger.run_id)
        while active is not None:
            # A redelivery may be this very delivery requeued (an outcome kept for it, a
            # publish to redo): it waits for the first to let go, then is judged by the claim.
            if active.attempt >= trigger.attempt and not message.redelivered:
                log.info("run %s attempt %s: duplicate or stale delivery: this worker holds "
                         "attempt %s of the run; acked without running", trigger.run_id,
                         trigger.attempt, active.attempt)
                await self._ack(message)
                return
            await active.done.wait()
            active = self._active.get(trigger.run_id)
        if self._shutting_down:
            await message.nack(requeue=True)
            return
        active = _Active(trigger.attempt,
                         None if trigger.task is None else trigger.task.parent_run_id)
        self._active[trigger.run_id] = active
        try:
            await self._handle_run(message, trigger, headers, active)
        except Exception as e:
            if _transient(e):
                raise  # requeued after a pause by _delivery
            await self._panicked(message, trigger, active, e)
        finally:
            active.done.set()
            if self._active.get(trigger.run_id) is active:
                del self._active[trigger.run_id]

    async def _handle_run(self, message: AbstractIncomingMessage, trigger: Trigger,
                          headers: dict[str, Any], active: _Active) -> None:
        # 2. find the handler (a reduce task's: the job's reducer).
        registered = self._registered(trigger)
        if registered is None:
            await self._unhandled(message, trigger, headers)
            return
        # 3. wait until due: re-tier a far-ahead delivery, hold a near one.
        not_before = header_int(headers, HEADER_NOT_BEFORE)
        starts_at: datetime | None = None
        if not_before is not None:
            ahead = not_before == ms_of(trigger.scheduled_at)
            hold_max = TRIGGER_HOLD_MAX_MS if ahead else HOLD_MAX_MS
            remaining = not_before - ms_of(datetime.now(timezone.utc))
            plan = plan_wait(remaining, hold_max)
            if isinstance(plan, Tier):
                log.info("run %s attempt %s: due in %d ms; sent through tier %s",
                         trigger.run_id, trigger.attempt, remaining, plan.name)
                await self._send_through(message, plan)
                return
            if plan > 0:
                starts_at = trigger.scheduled_at if ahead else from_ms(not_before)
        # 4. claim the attempt (or learn why not).
        count = header_int(headers, HEADER_DELIVERY_COUNT)
        last = (bool(message.redelivered) and count is not None
                and count >= self.topology.delivery_limit)
        if last:
            claim = Claim(None, datetime.now(timezone.utc), time.monotonic(),
                          await self.store.snapshot(trigger.run_id))
        else:
            # With the deliveries that arrived together; one the batch did not claim is
            # claimed alone, which reads why.
            assert self._claims is not None
            batched = await self._claims.submit(ClaimRequest(
                trigger.run_id, trigger.attempt, trigger.job, starts_at))
            if isinstance(batched, Claim):
                claim = batched
            else:
                # A failed batch may have committed with its reply lost: count it as a try.
                tries = 1 if isinstance(batched, Failed) and batched.maybe_ours else 0

                def claim_once() -> Awaitable[Claim]:
                    nonlocal tries
                    tries += 1
                    return self.store.claim(trigger.run_id, trigger.attempt, self.worker_id,
                                            trigger.job, starts_at, self.group)

                try:
                    claim = await self._with_retries("claim", claim_once)
                except Exception as e:
                    if _forbidden(e):
                        # The run is of a group this worker's database role may not act for:
                        # the trigger names another group's run (forged or misrouted). The
                        # refusal changes nothing; never retried.
                        await self._park(message, "implausible trigger: run "
                                         f"{trigger.run_id} is not of a group this worker may "
                                         f"act for: {e}")
                        return
                    log.error("run %s: claim failed (%s); requeueing", trigger.run_id, e)
                    await self._requeue(message)
                    return
                # A retried claim whose first try committed with its reply lost: the run is
                # `running` this attempt on this very worker.
                if (tries > 1 and claim.claimed_at is None and claim.run is not None
                        and claim.run.state == "running"
                        and claim.run.attempt == trigger.attempt
                        and claim.run.worker_id == self.worker_id):
                    claim = dataclasses.replace(claim, claimed_at=claim.claim_clock)
        attempt = trigger.attempt
        if claim.claimed_at is None:
            taken = await self._refused(message, trigger, claim, last, count)
            if taken is None:
                return
            attempt, claim = taken
            active.attempt = attempt
        active.claimed = attempt
        await self._run_claimed(message, trigger, registered, claim, attempt, starts_at,
                                active)

    def _registered(self, trigger: Trigger) -> _Registered | None:
        """What runs `trigger`: the job's handler, or for a reduce task its reducer; a reduce
        task of a job this worker handles but has no reducer for fails without retry."""
        task = trigger.task
        if task is None or task.kind != "reduce":
            return self.handlers.get(trigger.job)
        reducer = self.reducers.get(trigger.job)
        if reducer is not None or trigger.job not in self.handlers:
            return reducer
        message = (f"job {quote(trigger.job)} has a reduce task but this worker registers no "
                   f"reducer for it: register one with @worker.reducer({json.dumps(trigger.job)})"
                   " on the workers handling the job")

        async def no_reducer(ctx: Context, params: Any) -> None:
            raise Fail(message)

        return _Registered(no_reducer, None)

    async def _forward(self, message: AbstractIncomingMessage, trigger: Trigger,
                       target: str) -> None:
        """Republishes another worker's broadcast task unchanged to that worker's queue
        (mandatory, confirmed), then acks. When no queue takes it (that worker is gone for
        good) it is parked and its run ended dead: it never runs on another worker."""
        key = self.topology.worker_key(target)
        queue = self.topology.worker_queue(target)
        parent = trigger.task.parent_run_id if trigger.task is not None else None
        size = len(queue.encode("utf-8"))
        if size > MAX_QUEUE_NAME_BYTES:
            await self._park(message, (
                f"{IMPLAUSIBLE}broadcast task for worker {quote(target)}: its queue name would "
                f"be {size} bytes, over RabbitMQ's {MAX_QUEUE_NAME_BYTES}, so no such worker "
                "exists: the run is left as it is"))
            return
        try:
            await self.broker.copy(message, key)
        except PublishFailed as e:
            if e.returned:
                reason = (f"broadcast task for worker {quote(target)}: its queue {quote(queue)} "
                          "does not exist (the worker is gone); a broadcast task runs on its "
                          "own worker only, so it is not run elsewhere")
                if await self._park(message, reason):
                    await self.store.mark_dead(trigger.run_id, self.group, reason,
                                               self.worker_id, trigger.job, trigger.attempt)
                return
            log.error("forwarding broadcast task %s to worker %s failed (%s); requeueing it",
                      trigger.run_id, target, e)
            await self._requeue(message)
            return
        log.info("run %s: broadcast task of run %s forwarded to worker %s", trigger.run_id,
                 parent, target)
        await self._ack(message)

    async def _panicked(self, message: AbstractIncomingMessage, trigger: Trigger,
                        active: _Active, error: Exception) -> None:
        """A bug on this delivery's path (not the handler's): the attempt it claimed is
        recorded failed and its run dead, and the message parked, both with the reason."""
        reason = (f"the worker panicked handling this delivery: {type(error).__name__}: "
                  f"{error}")
        log.exception("run %s: %s", trigger.run_id, reason)
        if active.claimed is not None:
            row = OutcomeRow(trigger.run_id, active.claimed, "failed", 0, reason, "dead",
                             reason, None, None, [])
            try:
                await self._record(row)
            except Exception as e:
                log.error("run %s: recording the panic failed: %s", trigger.run_id, e)
        await self._park(message, reason, reason)

    async def _with_retries(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        deadline = time.monotonic() + self.db_retry_budget
        pause = 0.1
        while True:
            try:
                return await call()
            except Exception as e:
                if not _transient(e):
                    raise
                err = e
            if time.monotonic() + pause > deadline:
                raise err
            log.warning("%s failed (%s); retrying", what, err)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    async def _refused(self, message: AbstractIncomingMessage, trigger: Trigger, claim: Claim,
                       last: bool, count: int | None) -> tuple[int, Claim] | None:
        """Handles a refused claim (the table of step 4). Returns the attempt and claim of a
        take-over to run, or None when the delivery is settled."""
        run = claim.run
        redelivered = bool(message.redelivered)
        if run is None:
            log.info("run %s: duplicate or stale delivery: no such run; acked without running",
                     trigger.run_id)
            await self._ack(message)
            return None
        if run.job_name != trigger.job or run.group_name != self.group:
            await self._park(message, (
                f"{IMPLAUSIBLE}it names job {quote(trigger.job)} for run {trigger.run_id}, "
                f"which is job {quote(run.job_name)} of group {quote(run.group_name)}: the run "
                "is left as it is"))
            return None
        waiting = run.state in WAITING
        if waiting and trigger.attempt > run.attempt + 1:
            await self._park(message, (
                f"{IMPLAUSIBLE}attempt {trigger.attempt} of run {trigger.run_id}, whose next "
                f"attempt is {run.attempt + 1} (the database's history): the run is left as it "
                "is"))
            return None
        limit = self.topology.delivery_limit
        if last:
            reason = (f"delivery limit reached: the trigger was delivered {(count or 0) + 1} "
                      f"times without an ack (x-delivery-limit {limit}): workers holding it "
                      "crashed or lost their channel; not run again, to stop a crash loop")
            if waiting and run.attempt + 1 == trigger.attempt:
                if await self._park(message, reason):
                    await self.store.mark_dead(trigger.run_id, self.group, reason,
                                               self.worker_id, trigger.job, trigger.attempt)
                return None
        if waiting and run.cancel_requested:
            log.info("run %s: cancel requested; acked without running", trigger.run_id)
            await self._ack(message)
            return None
        if run.state == "retrying" and run.attempt >= trigger.attempt and redelivered:
            await self._publish_retry(message, trigger, run.attempt, run.next_attempt_at)
            return None
        if (run.state == "dead" and run.attempt >= trigger.attempt and run.reason
                and redelivered):
            await self._park(message, run.reason, run.error)
            return None
        kept = self._kept.pop((trigger.run_id, run.attempt), None)
        if kept is not None and run.state == "running" and run.worker_id == self.worker_id:
            log.info("run %s attempt %s: writing the outcome kept from before", trigger.run_id,
                     run.attempt)
            await self._settle(message, trigger, run.attempt, *kept, acked=False)
            return None
        if run.state == "running" and run.attempt >= trigger.attempt and run.worker_id:
            own_restart = run.worker_id == self.worker_id and run.holder_restarted
            lost = run.worker_lost
            if not lost and not own_restart and redelivered:
                deadline = time.monotonic() + 3 * (run.heartbeat_interval_ms or 5000) / 1000 + 1
                while time.monotonic() < deadline and not lost:
                    await asyncio.sleep(0.05)
                    again = await self.store.snapshot(trigger.run_id)
                    if again is None or again.state != "running" or again.attempt != run.attempt:
                        break
                    lost = again.worker_lost
            if lost or own_restart:
                return await self._take_over(message, trigger, run, own_restart, last, count)
        log.info("run %s attempt %s: duplicate or stale delivery: the run is not waiting for "
                 "this attempt; acked without running (it is %s at attempt %s)", trigger.run_id,
                 trigger.attempt, run.state, run.attempt)
        await self._ack(message)
        return None

    async def _take_over(self, message: AbstractIncomingMessage, trigger: Trigger,
                         run: Snapshot, own_restart: bool, last: bool, count: int | None
                         ) -> tuple[int, Claim] | None:
        holder = run.worker_id or "?"
        if own_restart:
            lost_error = f"worker {holder} restarted while running this attempt"
        else:
            lost_error = (f"worker {holder} was lost while running this attempt (no heartbeat "
                          f"for 3 × {run.heartbeat_interval_ms or 5000} ms, or stopped)")
        dead_reason = None
        if last:
            dead_reason = (f"delivery limit reached: the trigger was delivered {(count or 0) + 1}"
                           f" times without an ack (x-delivery-limit "
                           f"{self.topology.delivery_limit}); attempt {run.attempt} was lost "
                           f"with worker {holder}")
        outcome_, attempt, reason, clock, sent = await self.store.take_over(
            trigger.run_id, trigger.job, run.attempt, holder, lost_error, not own_restart,
            self.topology.delivery_limit, dead_reason, self.worker_id)
        log.info("run %s: take-over from %s: %s", trigger.run_id, holder, outcome_)
        if outcome_ == "claimed" and attempt is not None and clock is not None:
            return attempt, Claim(clock, clock, sent, run)
        if outcome_ == "dead":
            await self._park(message, reason or lost_error, lost_error)
            return None
        await self._ack(message)
        return None

    async def _unhandled(self, message: AbstractIncomingMessage, trigger: Trigger,
                         headers: dict[str, Any]) -> None:
        """Step 2: no handler here for the job."""
        now = datetime.now(timezone.utc)
        keep = {HEADER_NOT_BEFORE: header_int(headers, HEADER_NOT_BEFORE) or ms_of(now)}
        try:
            elsewhere = await self.store.handled_elsewhere(self.group, trigger.job,
                                                           self.worker_id)
        except Exception as e:
            log.warning("reading the worker registry failed (%s); looking again in 5 s", e)
            await self._send_through(message, _tier("5s"), keep)
            return
        task = trigger.task
        if task is not None and task.worker == self.worker_id:
            elsewhere = False  # it is for this worker only: another would forward it back
        if elsewhere:
            await self._send_through(message, RETRY_TIERS[0], keep)
            return
        until = trigger.scheduled_at + timedelta(seconds=self.unhandled_wait)
        if now < until:
            reason = (f"no worker handles this job (waiting until "
                      f"{until.replace(microsecond=0).isoformat().replace('+00:00', 'Z')}): no "
                      f"online worker of group {quote(self.group)} has a handler for "
                      f"{quote(trigger.job)}; then it is parked")
            waiting = await self.store.mark_unhandled(trigger.run_id, self.group, reason,
                                                      trigger.job, trigger.attempt)
            if waiting:
                waited = int((now - trigger.scheduled_at).total_seconds() * 1000)
                left = int((until - now).total_seconds() * 1000)
                await self._send_through(message, unhandled_pause(waited, left), keep)
                return
        jobs = sorted(self.handlers)
        listed = ", ".join(quote(j) for j in jobs[:LISTED_JOBS])
        if len(jobs) > LISTED_JOBS:
            listed += f" and {len(jobs) - LISTED_JOBS} more"
        reason = (f"unknown job {quote(trigger.job)}: worker {quote(self.worker_id)} of group "
                  f"{quote(self.group)} has handlers for {listed}")
        if await self._park(message, reason):
            await self.store.mark_dead(trigger.run_id, self.group, reason, self.worker_id,
                                       trigger.job, trigger.attempt)

    async def _run_claimed(self, message: AbstractIncomingMessage, trigger: Trigger,
                           registered: _Registered, claim: Claim, attempt: int,
                           starts_at: datetime | None, active: _Active) -> None:
        assert self._slots is not None
        logger = JobLogger(trigger.run_id, attempt)
        ctx = Context(run_id=trigger.run_id, job=trigger.job, attempt=attempt,
                      scheduled_at=trigger.scheduled_at, params=trigger.params, log=logger,
                      cancelled=active.cancelled, timeout_ms=trigger.timeout_ms,
                      task=trigger.task, calls=_StoreTaskCalls(self, trigger.run_id, attempt))
        acked = False

        def early_ack() -> None:
            # Before the broker's consumer_timeout: from then on the heartbeat protects the run.
            # A timer, not a task sleeping per delivery.
            nonlocal acked
            acked = True
            log.info("run %s: delivery held for %ss; acking early", trigger.run_id,
                     self.ack_after)
            self._spawn(self._ack(message))

        early = asyncio.get_running_loop().call_later(self.ack_after, early_ack)
        flusher: asyncio.Task[None] | None = None
        execution: Execution | None = None
        start_mono = time.monotonic()
        try:
            # Hold until the instant (claimed already), then take a handler slot.
            await self._slots.take(active, starts_at)
            try:
                start_mono = time.monotonic()
                if self._shutting_down and not active.cancelled.is_set():
                    active.interrupted = True
                    active.cancel()
                if active.cancelled.is_set():
                    # Cancelled (operator, shutdown) while held or waiting for a slot: recorded
                    # as a handler that returned "cancel" at once.
                    execution = Execution(Cancel("cancelled before the handler started"),
                                          cancel_requested=active.cancel_requested,
                                          interrupted=active.interrupted)
                else:
                    def start_flusher() -> None:
                        # Only for a handler that logs: no task per delivery otherwise.
                        nonlocal flusher
                        flusher = asyncio.create_task(logger.flush_loop(
                            lambda lines: self.store.append_logs(trigger.run_id, attempt,
                                                                 lines)))

                    logger.on_first_line = start_flusher
                    execution = await self._execute(registered, ctx, trigger, active)
            finally:
                self._slots.release()
            # Let the deliveries waiting for the slot just freed start their handlers before
            # this one records: a start is due now, a record can wait a moment.
            await asyncio.sleep(0)
        finally:
            early.cancel()
        duration_ms = max(0, int(round((time.monotonic() - start_mono) * 1000)))
        logger.close()
        if flusher is not None:
            await flusher
        handler_start = claim.claim_clock + timedelta(
            seconds=max(0.0, start_mono - claim.sent_monotonic))
        result = outcome(execution, int(self.cancel_grace * 1000))
        await self._settle(message, trigger, attempt, result, duration_ms, handler_start,
                           logger.rest(), acked)

    async def _execute(self, registered: _Registered, ctx: Context, trigger: Trigger,
                       active: _Active) -> Execution:
        """Step 5: the handler under its timeout and cancellation."""
        try:
            params = decode_params(trigger.params, registered.params, trigger.job)
        except Exception as e:  # Fail, or the params type's own error: the handler's
            return Execution(e)
        task: asyncio.Task[None] = asyncio.create_task(_call(registered.fn, ctx, params))
        timed_out: int | None = None
        # The first of: the handler returns, the run is cancelled, the timeout. One future and
        # callbacks (asyncio.wait would add a waiter and a set per handler).
        first = active.cancellation()
        task.add_done_callback(lambda _: _resolve(first))
        timer = None if trigger.timeout_ms is None else asyncio.get_running_loop().call_later(
            trigger.timeout_ms / 1000, _resolve, first)
        try:
            await first
        finally:
            if timer is not None:
                timer.cancel()
        done: set[asyncio.Task[None]] = {task} if task.done() else set()
        if not done:
            if not active.cancelled.is_set():
                timed_out = trigger.timeout_ms
                active.cancel()
            done, _ = await asyncio.wait({task}, timeout=self.cancel_grace)
        if task not in done:
            task.cancel()
            error: BaseException | str | None = "abandoned"
        elif task.cancelled():
            error = "abandoned"
        else:
            error = task.exception()
        return Execution(error, timed_out_ms=timed_out, interrupted=active.interrupted,
                         cancel_requested=active.cancel_requested)

    async def _settle(self, message: AbstractIncomingMessage, trigger: Trigger, attempt: int,
                      result: Outcome, duration_ms: int, handler_start: datetime,
                      logs: list[LogLine], acked: bool) -> None:
        """Steps 6 to 8: decide, record with the remaining lines, then retry/park/ack."""
        run_state = result.run
        reason = None
        next_at = None
        if run_state == "retryable":
            try:
                decision = await self._with_retries("retry decision", lambda: (
                    self.store.retry_decision(trigger.run_id, attempt, result.retry_after_ms)))
            except Exception as e:
                log.error("run %s: the retry decision failed (%s); requeueing", trigger.run_id,
                          e)
                if not acked:
                    await self._requeue(message)
                return
            run_state = decision.run_state
            next_at = decision.next_attempt_at
            if run_state == "dead":
                reason = decision.reason or "attempts exhausted"
                if result.error and result.error not in reason:
                    reason = f"{reason}: {result.error}"
        row = OutcomeRow(trigger.run_id, attempt, result.attempt_state, duration_ms,
                         result.error, run_state, reason, next_at, handler_start, logs)
        try:
            recorded, state = await self._record(row)
        except Exception as e:
            log.error("run %s attempt %s: recording the outcome failed (%s); kept for the "
                      "redelivery, requeueing the delivery", trigger.run_id, attempt, e)
            if not acked:
                self._kept[(trigger.run_id, attempt)] = (result, duration_ms, handler_start,
                                                         logs)
                await self._requeue(message)
            return
        self._recorded(trigger.run_id, attempt)
        if not recorded:
            log.info("run %s attempt %s: a late outcome (already recorded or taken over)",
                     trigger.run_id, attempt)
            if not acked:
                await self._ack(message)
            return
        # Every delivery passes here: at debug, so that INFO logging costs nothing per run.
        log.debug("run %s attempt %s: %s, run %s", trigger.run_id, attempt,
                  result.attempt_state, state)
        if acked:  # acked early (a long handler): publish the copies, ack nothing
            try:
                if state == "retrying":
                    await self._publish_retry(None, trigger, attempt, next_at, message)
                elif state == "dead":
                    await self.broker.park(message, reason or "dead", self.worker_id,
                                           result.error)
            except PublishFailed as e:
                log.error("run %s: publishing after an early ack failed (%s); the scheduler's "
                          "rescuer republishes a retry", trigger.run_id, e)
            return
        if state == "retrying":
            await self._publish_retry(message, trigger, attempt, next_at)
        elif state == "dead":
            await self._park(message, reason or "dead", result.error)
        else:
            await self._ack(message)

    def _recorded(self, run_id: int, attempt: int) -> None:
        active = self._active.get(run_id)
        if active is not None and active.claimed == attempt:
            active.claimed = None

    async def _record_many(self, rows: list[OutcomeRow]) -> list[tuple[int, bool, str | None]]:
        answers = {run_id: (run_id, recorded, state) for run_id, recorded, state
                   in await self.store.record_outcomes(rows, self.worker_id)}
        return [answers[r.run_id] for r in rows]

    async def _record(self, row: OutcomeRow) -> tuple[bool, str | None]:
        """Records `row` with the outcomes that finish together; one whose batch failed is
        recorded alone (with retries), so a failing run is found out and the others are not
        held back."""
        first = True
        if self._outcomes is not None:
            batched = await self._outcomes.submit(row)
            if not isinstance(batched, Failed):
                _, recorded, state = batched
                return recorded, state
            first = not batched.maybe_ours
        return await self._record_alone(row, first)

    async def _record_alone(self, row: OutcomeRow, first: bool) -> tuple[bool, str | None]:
        deadline = time.monotonic() + self.db_retry_budget
        pause = 0.1
        while True:
            try:
                if not first:
                    mine = await self.store.outcome_recorded(row, self.worker_id)
                    if mine is not False:
                        return True, mine if isinstance(mine, str) else None
                result = await self.store.record_outcomes([row], self.worker_id)
                _, recorded, state = result[0]
                return recorded, state
            except Exception as e:
                if not _transient(e) or time.monotonic() + pause > deadline:
                    raise
                log.warning("recording run %s failed (%s); retrying", row.run_id, e)
                first = False
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)

    async def _publish_retry(self, message: AbstractIncomingMessage | None, trigger: Trigger,
                             failed_attempt: int, next_at: datetime | None,
                             source: AbstractIncomingMessage | None = None) -> None:
        """Section 5: attempt + 1 through the largest tier that fits, then ack `message`."""
        original = message or source
        assert original is not None
        body_obj = json.loads(original.body)
        body_obj["attempt"] = failed_attempt + 1
        body = json.dumps(body_obj, separators=(",", ":")).encode()
        due = next_at or datetime.now(timezone.utc)
        remaining = ms_of(due) - ms_of(datetime.now(timezone.utc))
        extra = {HEADER_ATTEMPT: failed_attempt + 1, HEADER_NOT_BEFORE: ms_of(due)}
        tier = tier_for(remaining)
        # A retry due now goes to the work queue, or a broadcast task's to its worker's queue
        # (a delay tier dead-letters into the work queue, where it is forwarded).
        task = trigger.task
        due_key = (self.topology.worker_key(task.worker)
                   if task is not None and task.kind == "broadcast" and task.worker else WORK_KEY)
        if message is None:
            try:
                await self.broker.copy(original, tier.routing_key if tier else due_key,
                                       body=body, extra=extra)
            except PublishFailed as e:
                log.error("run %s: publishing the retry failed after an early ack (%s); the "
                          "scheduler's rescuer republishes it", trigger.run_id, e)
            return
        await self._send_through(message, tier, extra, body, due_key)


class _StoreTaskCalls:
    """`ctx.map`, `ctx.set_output`, `ctx.results`, `ctx.parent` and `ctx.upstream` of one
    attempt, through the database
    (retried on connection errors: each call is idempotent). A refusal (22023, invalid
    parameter: the message names the field, the value and the fix) is a TaskCallError."""

    def __init__(self, worker: Worker, run_id: int, attempt: int) -> None:
        self._worker = worker
        self._run_id = run_id
        self._attempt = attempt

    async def map(self, step: str, call_no: int, items: list[Any]) -> int:
        w = self._worker
        created: int = await self._call("map", lambda: w.store.map(
            self._run_id, self._attempt, w.worker_id, step, call_no, items))
        return created

    async def set_output(self, output: Any) -> bool:
        w = self._worker
        stored: bool = await self._call("set_output", lambda: w.store.set_output(
            self._run_id, self._attempt, w.worker_id, output))
        return stored

    async def results_page(self, after_id: int, page: int) -> list[TaskResult]:
        w = self._worker
        rows: list[TaskResult] = await self._call("results", lambda: w.store.task_results(
            self._run_id, after_id, page))
        return rows

    async def upstream(self, node: str | None = None) -> Upstream | None:
        w = self._worker
        found: Upstream | None = await self._call(
            "parent" if node is None else "upstream",
            lambda: w.store.upstream(self._run_id, node))
        return found

    async def _call(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        import asyncpg

        try:
            return await self._worker._with_retries(f"run {self._run_id}: {what}", call)
        except asyncpg.exceptions.InvalidParameterValueError as e:
            detail = f" ({e.detail})" if getattr(e, "detail", None) else ""
            raise TaskCallError(f"ctx.{what} of run {self._run_id} refused: {e}{detail}"
                                ) from None


def _tier(name: str) -> Tier:
    return next(t for t in RETRY_TIERS if t.name == name)


def _forbidden(error: BaseException) -> bool:
    """A refusal of the worker's database role (SQLSTATE 42501, insufficient_privilege): the
    run, worker or job is of a group the role may not act for (docs/protocol.md section 11)."""
    return getattr(error, "sqlstate", None) == "42501"


def _transient(error: BaseException) -> bool:
    """A connection-level failure (database or broker) worth a requeue, not a bug."""
    import asyncpg

    return isinstance(error, (OSError, asyncio.TimeoutError, PublishFailed,
                              asyncpg.exceptions.PostgresConnectionError,
                              asyncpg.exceptions.OperatorInterventionError,
                              asyncpg.exceptions.InterfaceError,
                              asyncpg.exceptions.ConnectionDoesNotExistError))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _call(fn: Handler, ctx: Context, params: Any) -> None:
    await fn(ctx, params)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


__all__ = ["Worker", "decode_params"]
