"""The Chime wire protocol (version 1) as pure Python: names, bounds, decoding and checks.

Every constant mirrors the `chime-protocol` crate (docs/protocol.md names each one's home);
nothing here does IO, so each rule is unit-testable.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

PROTOCOL_VERSION = 1
CONTENT_TYPE = "application/json"

HEADER_ATTEMPT = "x-chime-attempt"
HEADER_TERM = "x-chime-term"
HEADER_NOT_BEFORE = "x-chime-not-before"
HEADER_DEAD_REASON = "x-chime-dead-reason"
HEADER_DEAD_BY = "x-chime-dead-by"
HEADER_PARKED_AT = "x-chime-parked-at"
HEADER_ERROR = "x-chime-error"
HEADER_HEADERS_DROPPED = "x-chime-headers-dropped"
HEADER_DELIVERY_COUNT = "x-delivery-count"

#: Headers a copy never carries: the broker's own and the parking ones (section 4, step 3).
BROKER_HEADERS = ("x-delivery-count", "x-death", "x-first-death-", "x-last-death-")
PARKING_HEADERS = (HEADER_DEAD_REASON, HEADER_DEAD_BY, HEADER_PARKED_AT, HEADER_ERROR,
                   HEADER_HEADERS_DROPPED)

WORK_KEY = "work"
#: Routing keys of workers' own queues start with this (`Topology.worker_key`).
WORKER_KEY_PREFIX = "worker."
PARKING_KEY = "parking"
# A worker's own queue is deleted by the broker after this long unused (x-expires, one day).
WORKER_QUEUE_EXPIRES_MS = 24 * 3600 * 1000
DEFAULT_PREFIX = "chime"
DEFAULT_DELIVERY_LIMIT = 5

DAY_MS = 24 * 60 * 60 * 1000
MAX_RETRY_DELAY_MS = 7 * DAY_MS
NOT_BEFORE_SLACK_MS = 60 * 60 * 1000
MAX_TIMEOUT_MS = 7 * DAY_MS
MAX_ATTEMPTS = 1000
MAX_MULTIPLIER = 100.0
MAX_UNHANDLED_WAIT_MS = DAY_MS
MAX_NAME_BYTES = 63
MAX_PARAMS_BYTES = 64 * 1024
MAX_TRIGGER_BYTES = MAX_PARAMS_BYTES + 4 * 1024
MAX_LOG_LINES_PER_ATTEMPT = 10_000
MAX_HEADER_VALUE_BYTES = 4 * 1024
MAX_COPIED_HEADER_BYTES = 16 * 1024
HOLD_MAX_MS = 250
#: Job kinds (docs/protocol.md, "Job kinds and tasks"). The bounds the database enforces in
#: `chime_map` / `chime_set_output` / `chime_expand_run` (migration job_kinds), checked here too
#: so a handler's mistake is named before a round trip.
MAX_MAP_ITEMS_PER_CALL = 10_000
MAX_TASK_OUTPUT_BYTES = 64 * 1024
MAX_TASKS_PER_RUN = 100_000
MAX_SHARDS = 10_000
#: Rows per `chime_task_results` page (the function caps a page at 1000).
TASK_RESULTS_PAGE = 1000
TASK_KINDS = ("broadcast", "shard", "root", "map", "reduce")
#: RabbitMQ's longest queue name: a `task.worker` whose queue name would be longer names no
#: worker.
MAX_QUEUE_NAME_BYTES = 255
TRIGGER_HOLD_MAX_MS = 4000
IMPLAUSIBLE = "implausible trigger: "
TRUNCATED_MARK = "…[truncated]"


@dataclass(frozen=True)
class Tier:
    """One delay tier: a queue whose messages wait `ttl_ms`, then go back to the work queue."""

    name: str
    ttl_ms: int

    @property
    def routing_key(self) -> str:
        return f"retry.{self.name}"


RETRY_TIERS: tuple[Tier, ...] = tuple(
    Tier(n, ms)
    for n, ms in [
        ("250ms", 250), ("500ms", 500), ("1s", 1000), ("2s", 2000), ("5s", 5000),
        ("10s", 10_000), ("30s", 30_000), ("1m", 60_000), ("2m", 120_000), ("5m", 300_000),
        ("10m", 600_000), ("30m", 1_800_000), ("1h", 3_600_000),
    ]
)


class Topology:
    """Queue and exchange names and arguments of one executor group (section 1)."""

    def __init__(self, prefix: str, group: str, delivery_limit: int = DEFAULT_DELIVERY_LIMIT):
        self.prefix = prefix
        self.group = group
        self.delivery_limit = delivery_limit

    @property
    def exchange(self) -> str:
        return f"{self.prefix}.{self.group}"

    @property
    def work_queue(self) -> str:
        return f"{self.prefix}.{self.group}.work"

    @property
    def parking_queue(self) -> str:
        return f"{self.prefix}.{self.group}.parking"

    @property
    def control_exchange(self) -> str:
        return f"{self.prefix}.control"

    def worker_queue(self, worker_id: str) -> str:
        """Worker `worker_id`'s own queue, `P.G.worker.<id>`: the broadcast tasks for that
        worker (durable, with the work queue's arguments)."""
        return f"{self.prefix}.{self.group}.worker.{worker_id}"

    @staticmethod
    def worker_key(worker_id: str) -> str:
        """The routing key of worker `worker_id`'s own queue: `worker.<id>`."""
        return f"{WORKER_KEY_PREFIX}{worker_id}"

    def retry_queue(self, tier: Tier) -> str:
        return f"{self.prefix}.{self.group}.retry.{tier.name}"

    def work_queue_arguments(self) -> dict[str, Any]:
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.delivery_limit,
            "x-dead-letter-exchange": self.exchange,
            "x-dead-letter-routing-key": PARKING_KEY,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }

    def worker_queue_arguments(self) -> dict[str, Any]:
        """A worker's own queue: the work queue's arguments and `x-expires` (one day unused,
        then the broker deletes it: protocol/src/topology.rs WORKER_QUEUE_EXPIRES)."""
        return {**self.work_queue_arguments(), "x-expires": WORKER_QUEUE_EXPIRES_MS}

    def parking_queue_arguments(self) -> dict[str, Any]:
        return {"x-queue-type": "quorum"}

    def retry_queue_arguments(self, tier: Tier) -> dict[str, Any]:
        return {
            "x-queue-type": "quorum",
            "x-message-ttl": tier.ttl_ms,
            "x-dead-letter-exchange": self.exchange,
            "x-dead-letter-routing-key": WORK_KEY,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int
    initial_ms: int
    multiplier: float
    max_ms: int
    jitter: bool


@dataclass(frozen=True)
class Shard:
    """A shard's place in its run: 0-based `index`, `total` shards, and the job's
    `shard_params` entry for this index (`param`, None when it has none)."""

    index: int
    total: int
    param: Any = None


@dataclass(frozen=True)
class Task:
    """Which task of its run a trigger is (a broadcast, sharded or map/reduce job's fire);
    absent for a single run. The trigger's `run_id` is the task's own run id."""

    #: The run (the fire) this task belongs to: what `chime runs show` lists, what a cancel
    #: names.
    parent_run_id: int
    #: Unique in the run: `worker/<id>`, `shard/<n>`, `root`, `reduce`, or
    #: `<caller>/<step>/<call>/<n>` for a mapped sub-task.
    key: str
    #: One of `broadcast`, `shard`, `root`, `map`, `reduce`.
    kind: str
    shard: Shard | None = None
    #: A broadcast task's worker (its trigger goes to that worker's own queue).
    worker: str | None = None
    #: A mapped sub-task's step name, as its caller named it.
    step: str | None = None
    #: A map/reduce task's depth: the root 0, what it maps 1, and so on.
    depth: int | None = None


@dataclass(frozen=True)
class Trigger:
    """A decoded trigger message body (section 2)."""

    v: int
    run_id: int
    job: str
    group: str
    attempt: int
    scheduled_at: datetime
    params: Any
    timeout_ms: int | None
    retry: RetryPolicy | None
    task: Task | None = None


class DecodeError(ValueError):
    """The body is not a Chime trigger; the message is the parking reason."""


U32 = (0, 2**32 - 1)
U64 = (0, 2**64 - 1)
I64 = (-(2**63), 2**63 - 1)


def _int(obj: Mapping[str, Any], field: str, bounds: tuple[int, int]) -> int:
    if field not in obj:
        raise DecodeError(f"message body is not a Chime trigger: missing field `{field}`")
    value: object = obj[field]
    if isinstance(value, bool) or not isinstance(value, int):
        raise DecodeError(
            f"message body is not a Chime trigger: invalid type: {_kind(value)}, expected an "
            f"integer (field `{field}`)"
        )
    if not bounds[0] <= value <= bounds[1]:
        raise DecodeError(
            f"message body is not a Chime trigger: field `{field}` is {value}, outside "
            f"{bounds[0]}..={bounds[1]}"
        )
    return value


def _kind(value: object) -> str:
    """A JSON value as serde names it in its errors (`string "x"`, `integer 5`, ...)."""
    text = json.dumps(value)[:80]
    if isinstance(value, str):
        return f"string {text}"
    if isinstance(value, bool):
        return f"boolean `{text}`"
    if isinstance(value, int):
        return f"integer `{text}`"
    if isinstance(value, float):
        return f"floating point `{text}`"
    if value is None:
        return "null"
    return "sequence" if isinstance(value, list) else "map"


def _str(obj: Mapping[str, Any], field: str) -> str:
    if field not in obj:
        raise DecodeError(f"message body is not a Chime trigger: missing field `{field}`")
    value = obj[field]
    if not isinstance(value, str):
        raise DecodeError(
            f"message body is not a Chime trigger: invalid type: {_kind(value)}, expected a "
            f"string (field `{field}`)"
        )
    return value


def parse_rfc3339(text: str) -> datetime:
    """An RFC 3339 instant (with offset or `Z`) as an aware UTC datetime."""
    t = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if t.tzinfo is None:
        raise ValueError("an RFC 3339 instant needs an offset or Z")
    return t.astimezone(timezone.utc)


def decode_trigger(body: bytes) -> Trigger:
    """Decodes and shape-checks a trigger body (section 4, step 1); raises DecodeError."""
    if len(body) > MAX_TRIGGER_BYTES:
        raise DecodeError(
            f"message body is {len(body)} bytes, over the limit of {MAX_TRIGGER_BYTES} "
            "(limits::MAX_TRIGGER_BYTES): not decoded"
        )
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise DecodeError(f"message body is not a Chime trigger: {e}") from None
    if not isinstance(obj, dict):
        raise DecodeError("message body is not a Chime trigger: expected a JSON object")
    v = _int(obj, "v", U32)
    if v != PROTOCOL_VERSION:
        raise DecodeError(
            f"unsupported trigger protocol version {v} (this worker speaks {PROTOCOL_VERSION})"
        )
    run_id = _int(obj, "run_id", I64)
    job = _str(obj, "job")
    group = _str(obj, "group")
    attempt = _int(obj, "attempt", U32)
    scheduled_text = _str(obj, "scheduled_at")
    try:
        scheduled_at = parse_rfc3339(scheduled_text)
    except ValueError as e:
        raise DecodeError(
            f"message body is not a Chime trigger: field `scheduled_at` {scheduled_text[:80]!r} "
            f"is not an RFC 3339 instant: {e}"
        ) from None
    timeout_ms = None if obj.get("timeout_ms") is None else _int(obj, "timeout_ms", U64)
    retry = None
    if obj.get("retry") is not None:
        r = obj["retry"]
        if not isinstance(r, dict):
            raise DecodeError("message body is not a Chime trigger: field `retry` must be an object")
        mult = r.get("multiplier")
        if isinstance(mult, bool) or not isinstance(mult, (int, float)):
            raise DecodeError(
                "message body is not a Chime trigger: field `retry.multiplier` must be a number"
            )
        jitter = r.get("jitter")
        if not isinstance(jitter, bool):
            raise DecodeError(
                "message body is not a Chime trigger: field `retry.jitter` must be a boolean"
            )
        retry = RetryPolicy(
            max_attempts=_int(r, "max_attempts", U32),
            initial_ms=_int(r, "initial_ms", U64),
            multiplier=float(mult),
            max_ms=_int(r, "max_ms", U64),
            jitter=jitter,
        )
    task = None if obj.get("task") is None else _decode_task(obj["task"])
    if attempt < 1:
        raise DecodeError("trigger attempt must be at least 1")
    return Trigger(v, run_id, job, group, attempt, scheduled_at, obj.get("params"), timeout_ms,
                   retry, task)


def _decode_task(t: object) -> Task:
    """The trigger's `task` object; unknown keys are ignored (a newer scheduler's fields)."""
    bad = "message body is not a Chime trigger: "
    if not isinstance(t, dict):
        raise DecodeError(f"{bad}invalid type: {_kind(t)}, expected an object (field `task`)")
    kind = _str(t, "kind")
    if kind not in TASK_KINDS:
        raise DecodeError(f"{bad}unknown variant `{kind[:80]}`, expected one of "
                          f"{', '.join(f'`{k}`' for k in TASK_KINDS)} (field `task.kind`)")
    shard = None
    if t.get("shard") is not None:
        s = t["shard"]
        if not isinstance(s, dict):
            raise DecodeError(f"{bad}invalid type: {_kind(s)}, expected an object (field "
                              "`task.shard`)")
        shard = Shard(_int(s, "index", U32), _int(s, "total", U32), s.get("param"))
    optional: dict[str, str | None] = {}
    for name in ("worker", "step"):
        optional[name] = None if t.get(name) is None else _str(t, name)
    depth = None if t.get("depth") is None else _int(t, "depth", U32)
    return Task(_int(t, "parent_run_id", I64), _str(t, "key"), kind, shard,
                optional["worker"], optional["step"], depth)


def cap_bytes(value: str, limit: int) -> str:
    """`value` cut at a character boundary to at most `limit` bytes, marked when cut."""
    raw = value.encode("utf-8")
    if len(raw) <= limit:
        return value
    room = max(0, limit - len(TRUNCATED_MARK.encode("utf-8")))
    return raw[:room].decode("utf-8", errors="ignore") + TRUNCATED_MARK


def cap_header_value(value: str) -> str:
    return cap_bytes(value, MAX_HEADER_VALUE_BYTES)


def quote(name: str) -> str:
    return f"`{cap_bytes(name, 80)}`"


def _days(ms: int) -> str:
    return f"{ms // 1000}s ({ms // DAY_MS} days)"


def header_int(headers: Mapping[str, Any], name: str) -> int | None:
    """A header's integer value; None when absent; ValueError when not an integer."""
    if name not in headers or headers[name] is None:
        return None
    value: object = headers[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(name)
    return value


def check_trigger(
    trigger: Trigger,
    *,
    group: str,
    headers: Mapping[str, Any],
    redelivered: bool,
    delivery_limit: int,
    now: datetime,
) -> str | None:
    """The checks of "What a worker checks" that need no database; the parking reason or None."""
    d = _check_detail(trigger, group, headers, redelivered, delivery_limit, now)
    return None if d is None else IMPLAUSIBLE + d


def _check_detail(trigger: Trigger, group: str, headers: Mapping[str, Any], redelivered: bool,
                  delivery_limit: int, now: datetime) -> str | None:
    def bound(what: str, value: str, limit: str, name: str) -> str:
        return f"{what} is {value}, over the limit of {limit} (limits::{name})"

    job_bytes = len(trigger.job.encode("utf-8"))
    if job_bytes > MAX_NAME_BYTES:
        return bound(f"job name {quote(trigger.job)}", f"{job_bytes} bytes",
                     f"{MAX_NAME_BYTES} bytes", "MAX_NAME_BYTES")
    if trigger.group != group:
        return (f"it names group {quote(trigger.group)} but came from the work queue of group "
                f"{quote(group)}")
    if trigger.attempt > MAX_ATTEMPTS:
        return bound("attempt", str(trigger.attempt), str(MAX_ATTEMPTS), "MAX_ATTEMPTS")
    if trigger.timeout_ms is not None and trigger.timeout_ms > MAX_TIMEOUT_MS:
        return bound("timeout_ms", f"{trigger.timeout_ms} ms", _days(MAX_TIMEOUT_MS),
                     "MAX_TIMEOUT")
    if trigger.retry is not None:
        p = trigger.retry
        if p.max_attempts > MAX_ATTEMPTS:
            return bound("retry.max_attempts", str(p.max_attempts), str(MAX_ATTEMPTS),
                         "MAX_ATTEMPTS")
        for field, ms in (("retry.initial_ms", p.initial_ms), ("retry.max_ms", p.max_ms)):
            if ms > MAX_RETRY_DELAY_MS:
                return bound(field, f"{ms} ms", _days(MAX_RETRY_DELAY_MS), "MAX_RETRY_DELAY")
        if not math.isfinite(p.multiplier) or p.multiplier > MAX_MULTIPLIER:
            return bound("retry.multiplier", str(p.multiplier), str(MAX_MULTIPLIER),
                         "MAX_MULTIPLIER")
    try:
        not_before = header_int(headers, HEADER_NOT_BEFORE)
    except ValueError:
        return f"header {HEADER_NOT_BEFORE} is not an integer (Unix milliseconds)"
    if not_before is not None:
        horizon = MAX_RETRY_DELAY_MS + NOT_BEFORE_SLACK_MS
        latest = ms_of(now) + horizon
        if not_before > latest:
            try:
                at = datetime.fromtimestamp(not_before / 1000, timezone.utc).isoformat()
            except (OverflowError, OSError, ValueError):
                at = "out of range"
            return (f"header {HEADER_NOT_BEFORE} {not_before} ({at}) is further ahead than "
                    f"limits::MAX_RETRY_DELAY + limits::NOT_BEFORE_SLACK ({_days(horizon)}) "
                    f"from now ({now.isoformat()})")
    try:
        count = header_int(headers, HEADER_DELIVERY_COUNT)
    except ValueError:
        return "header x-delivery-count is not an integer"
    if count is not None:
        if count != 0 and not redelivered:
            return (f"x-delivery-count {count} on a first delivery (the broker's redelivered "
                    "flag is not set): only the broker counts deliveries, so the publisher set it")
        if count < 0 or (delivery_limit > 0 and count > delivery_limit):
            return (f"x-delivery-count {count} is outside 0..={delivery_limit} (the work "
                    "queue's x-delivery-limit): the broker never delivers such a count")
    return None


def plan_wait(remaining_ms: int, hold_max_ms: int = HOLD_MAX_MS) -> Tier | int:
    """0: due now; a positive int: hold that many ms; a Tier: send through that tier."""
    if remaining_ms <= 0:
        return 0
    if remaining_ms < hold_max_ms:
        return remaining_ms
    for tier in reversed(RETRY_TIERS):
        if tier.ttl_ms <= remaining_ms:
            return tier
    return remaining_ms


def tier_for(remaining_ms: int) -> Tier | None:
    """The largest tier not longer than `remaining_ms`, or None (publish to `work`)."""
    for tier in reversed(RETRY_TIERS):
        if tier.ttl_ms <= remaining_ms:
            return tier
    return None


def unhandled_pause(waited_ms: int, left_ms: int) -> Tier:
    want = min(max(waited_ms // 2, 5000), 30_000)
    want = min(want, max(left_ms, 0))
    return tier_for(want) or RETRY_TIERS[0]


def copied_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The original's headers a copy carries (section 6): no broker or parking headers, string
    values capped at 4 KiB, in name order only the first 16 KiB; the rest counted."""
    out: dict[str, Any] = {}
    used = 0
    dropped = 0
    for name in sorted(headers):
        if name.startswith(BROKER_HEADERS) or name in PARKING_HEADERS:
            continue
        value = headers[name]
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        if isinstance(value, str):
            value = cap_header_value(value)
        size = len(name.encode("utf-8")) + len(str(value).encode("utf-8"))
        if used + size > MAX_COPIED_HEADER_BYTES:
            dropped += 1
            continue
        used += size
        out[name] = value
    if dropped:
        out[HEADER_HEADERS_DROPPED] = dropped
    return out


def rfc3339(t: datetime) -> str:
    """`t` as RFC 3339 in UTC with a `Z`, to the millisecond at least."""
    return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def ms_of(t: datetime) -> int:
    """Unix milliseconds of `t`, truncated (as chrono's `timestamp_millis`)."""
    return (t - _EPOCH) // timedelta(milliseconds=1)


def from_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)
