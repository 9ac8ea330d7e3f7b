"""The database side: one method per protocol function (docs/protocol.md section 10).

The only module that speaks SQL, and only `SELECT ... FROM chime_xxx(...)` calls: the worker
never reads or writes a table itself.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence

import asyncpg

from .context import LogLine
from .tasks import TaskResult, Upstream

CLAIM_ALONE = """
WITH claimed AS MATERIALIZED (
    SELECT * FROM chime_claim(ARRAY[$1::bigint], ARRAY[$2::int], ARRAY[$4::text],
                              ARRAY[$5::timestamptz], $3, $6)
)
SELECT (SELECT started_at FROM claimed) AS claimed_at, statement_timestamp() AS claim_clock, s.*
  FROM chime_run_snapshot($1) s
"""
#: Several claims in one statement; answers the runs claimed (docs/protocol.md section 4, step 4).
CLAIM_MANY = """
SELECT run_id, started_at, claim_clock
  FROM chime_claim($1::bigint[], $2::int[], $3::text[], $4::timestamptz[], $5, $6)
"""


@dataclass(frozen=True)
class ClaimRequest:
    """One delivery's claim, for `Store.claim_many`."""

    run_id: int
    attempt: int
    job: str
    starts_at: datetime | None


@dataclass(frozen=True)
class Snapshot:
    job_name: str
    group_name: str
    state: str
    attempt: int
    worker_id: str | None
    reason: str | None
    error: str | None
    next_attempt_at: datetime | None
    cancel_requested: bool
    heartbeat_interval_ms: int | None
    holder_restarted: bool
    worker_lost: bool


@dataclass(frozen=True)
class Claim:
    """A claim's answer: `claimed_at` set when this worker owns the attempt; the run as it was
    before the claim (None: no such run); the database clock and the worker's monotonic time
    when the statement was sent."""

    claimed_at: datetime | None
    claim_clock: datetime
    sent_monotonic: float
    run: Snapshot | None


@dataclass(frozen=True)
class RetryDecision:
    run_state: str  # 'retrying' or 'dead'
    next_attempt_at: datetime | None
    reason: str | None


@dataclass(frozen=True)
class OutcomeRow:
    run_id: int
    attempt: int
    attempt_state: str
    duration_ms: int
    error: str | None
    run_state: str
    reason: str | None
    next_attempt_at: datetime | None
    handler_start: datetime | None
    logs: Sequence[LogLine]


async def _init(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads,
                              schema="pg_catalog")


async def create_pool(url: str, max_size: int) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(url, min_size=1, max_size=max_size, init=_init)
    assert pool is not None
    return pool


class Store:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def claim(self, run_id: int, attempt: int, worker: str, job: str,
                    starts_at: datetime | None, group: str) -> Claim:
        async with self.pool.acquire() as conn:
            sent = time.monotonic()
            row = await conn.fetchrow(CLAIM_ALONE, run_id, attempt, worker, job, starts_at,
                                      group)
        if row is None:  # no such run: the snapshot is empty
            async with self.pool.acquire() as conn:
                clock = await conn.fetchval("SELECT statement_timestamp()")
            return Claim(None, clock, sent, None)
        return Claim(row["claimed_at"], row["claim_clock"], sent, _snapshot(row))

    async def claim_many(self, claims: Sequence[ClaimRequest], worker: str, group: str
                         ) -> list[Claim | None]:
        """Claims several attempts in one statement, without retries: one answer per claim, in
        order, None for a claim refused (claim it alone to learn why). A claimed run's `Claim`
        has no snapshot."""
        async with self.pool.acquire() as conn:
            sent = time.monotonic()
            rows = await conn.fetch(CLAIM_MANY, [c.run_id for c in claims],
                                    [c.attempt for c in claims], [c.job for c in claims],
                                    [c.starts_at for c in claims], worker, group)
        claimed = {r["run_id"]: r for r in rows}
        answers: list[Claim | None] = []
        for c in claims:
            r = claimed.get(c.run_id)
            answers.append(None if r is None else
                           Claim(r["started_at"], r["claim_clock"], sent, None))
        return answers

    async def snapshot(self, run_id: int) -> Snapshot | None:
        row = await self.pool.fetchrow("SELECT * FROM chime_run_snapshot($1)", run_id)
        return None if row is None else _snapshot(row)

    async def take_over(self, run_id: int, job: str, lost_attempt: int, lost_worker: str,
                        lost_error: str, require_lost: bool, delivery_limit: int,
                        dead_reason: str | None, new_worker: str
                        ) -> tuple[str, int | None, str | None, datetime | None, float]:
        async with self.pool.acquire() as conn:
            sent = time.monotonic()
            row = await conn.fetchrow(
                "SELECT * FROM chime_take_over($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                run_id, job, lost_attempt, lost_worker, lost_error, require_lost,
                delivery_limit, dead_reason, new_worker)
        assert row is not None
        return row["outcome"], row["attempt"], row["reason"], row["claim_clock"], sent

    async def retry_decision(self, run_id: int, attempt: int,
                             retry_after_ms: int | None) -> RetryDecision:
        """Retry-or-dead after a retryable failure of `attempt`, decided by the database from
        the run's retry policy snapshot (`chime_retry_decision`)."""
        row = await self.pool.fetchrow(
            "SELECT * FROM chime_retry_decision($1::bigint, $2::int, $3::bigint)",
            run_id, attempt, retry_after_ms)
        if row is None:
            return RetryDecision("dead", None, "the run is gone")
        return RetryDecision(row["run_state"], row["next_attempt_at"], row["reason"])

    async def record_outcomes(self, rows: Sequence[OutcomeRow], worker: str
                              ) -> list[tuple[int, bool, str | None]]:
        logs = [(r.run_id, r.attempt, line) for r in rows for line in r.logs]
        result = await self.pool.fetch(
            "SELECT * FROM chime_record_outcomes($1::bigint[], $2::int[], $3::text[], "
            "$4::bigint[], $5::text[], $6::text[], $7::text[], $8::timestamptz[], "
            "$9::timestamptz[], $10, $11::bigint[], $12::int[], $13::timestamptz[], "
            "$14::text[], $15::text[])",
            [r.run_id for r in rows], [r.attempt for r in rows],
            [r.attempt_state for r in rows], [r.duration_ms for r in rows],
            [r.error for r in rows], [r.run_state for r in rows], [r.reason for r in rows],
            [r.next_attempt_at for r in rows], [r.handler_start for r in rows], worker,
            [l[0] for l in logs], [l[1] for l in logs], [l[2].at for l in logs],
            [l[2].level for l in logs], [l[2].message for l in logs])
        return [(r["run_id"], r["attempt_recorded"], r["run_state"]) for r in result]

    async def outcome_recorded(self, row: OutcomeRow, worker: str) -> str | None | bool:
        """The run's state when exactly this outcome was recorded by this worker; False if not."""
        r = await self.pool.fetchrow(
            "SELECT * FROM chime_outcome_recorded($1, $2, $3, $4, $5, $6)",
            row.run_id, row.attempt, worker, row.attempt_state, row.duration_ms, row.error)
        if r is None:
            return False
        state: str | None = r["run_state"]
        return state

    async def append_logs(self, run_id: int, attempt: int, lines: Sequence[LogLine]) -> None:
        await self.pool.execute(
            "SELECT FROM chime_append_logs($1, $2, $3::timestamptz[], $4::text[], $5::text[])",
            run_id, attempt, [l.at for l in lines], [l.level for l in lines],
            [l.message for l in lines])

    async def mark_dead(self, run_id: int, group: str, reason: str, worker: str, job: str,
                        attempt: int) -> bool:
        return bool(await self.pool.fetchval(
            "SELECT chime_mark_dead($1, $2, $3, $4, $5, $6)",
            run_id, group, reason, worker, job, attempt))

    async def mark_unhandled(self, run_id: int, group: str, reason: str, job: str,
                             attempt: int) -> bool:
        return bool(await self.pool.fetchval(
            "SELECT chime_mark_unhandled($1, $2, $3, $4, $5)", run_id, group, reason, job,
            attempt))

    async def handled_elsewhere(self, group: str, job: str, me: str) -> bool:
        return bool(await self.pool.fetchval(
            "SELECT chime_handled_elsewhere($1, $2, $3)", group, job, me))

    async def register(self, worker: str, group: str, hostname: str, capacity: int,
                       jobs: list[str], heartbeat_interval_ms: int) -> None:
        await self.pool.execute("SELECT FROM chime_register_worker($1, $2, $3, $4, $5, $6)",
                                worker, group, hostname, capacity, jobs,
                                heartbeat_interval_ms)

    async def map(self, caller: int, attempt: int, worker: str, step: str, call_no: int,
                  items: Sequence[Any]) -> int:
        """`chime_map`: the sub-tasks of one map call; how many were new."""
        return int(await self.pool.fetchval(
            "SELECT chime_map($1::bigint, $2::int, $3, $4, $5::int, $6::jsonb[])",
            caller, attempt, worker, step, call_no, list(items)))

    async def set_output(self, run_id: int, attempt: int, worker: str, output: Any) -> bool:
        """`chime_set_output`; False when that attempt is not running on `worker`."""
        return bool(await self.pool.fetchval(
            "SELECT chime_set_output($1::bigint, $2::int, $3, $4::jsonb)",
            run_id, attempt, worker, output))

    async def task_results(self, reduce_run: int, after_id: int, page: int
                           ) -> list[TaskResult]:
        """`chime_task_results`: the other tasks of `reduce_run`'s run after `after_id`."""
        rows = await self.pool.fetch(
            "SELECT * FROM chime_task_results($1::bigint, $2::bigint, $3::int)",
            reduce_run, after_id, page)
        return [TaskResult(r["id"], r["task_key"], r["task_kind"], r["map_step"],
                           r["shard_index"], r["state"], r["output"], r["error"], r["params"])
                for r in rows]

    async def upstream(self, run_id: int, node: str | None = None) -> Upstream | None:
        """`chime_upstream_runs`: its row whose `node` is `node`. With `node` None, the run
        that ended and started run `run_id`'s fire (a child job's run, or a task of one), None
        for a run no other run made; with a node name, the latest ended run of that node of
        the workflow run `run_id` is a node run (or a task of one) of, None for a node not
        ended or unknown, or a run of no workflow."""
        r = await self.pool.fetchrow(
            "SELECT node, run_id, job_name, state, output, error, finished_at "
            "FROM chime_upstream_runs($1::bigint) WHERE node IS NOT DISTINCT FROM $2::text "
            "LIMIT 1", run_id, node)
        if r is None:
            return None
        return Upstream(r["run_id"], r["job_name"], r["state"], r["output"], r["error"],
                        r["finished_at"], r["node"])

    async def heartbeat(self, worker: str) -> None:
        await self.pool.execute("SELECT FROM chime_heartbeat($1)", worker)

    async def stopped(self, worker: str) -> None:
        await self.pool.execute("SELECT FROM chime_worker_stopped($1)", worker)


def _snapshot(row: Any) -> Snapshot:
    return Snapshot(
        job_name=row["job_name"], group_name=row["group_name"], state=row["state"],
        attempt=row["attempt"], worker_id=row["worker_id"], reason=row["reason"],
        error=row["error"], next_attempt_at=row["next_attempt_at"],
        cancel_requested=bool(row["cancel_requested"]),
        heartbeat_interval_ms=row["heartbeat_interval_ms"],
        holder_restarted=bool(row["holder_restarted"]), worker_lost=bool(row["worker_lost"]))
