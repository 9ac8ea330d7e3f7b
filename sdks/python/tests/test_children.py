"""Child jobs against the real PostgreSQL (and RabbitMQ for the worker's path): a child job's
run reads the run that ended and started it (`chime_upstream_runs`) through the store and
through `ctx.parent()`; other runs read none.

The tests act as the leader where it is needed: a child run is inserted as `chime_advance`
makes it (trigger `child`, `upstream_run_id` set), or made by `chime_advance` itself under the
test's lease, and its trigger published as any run's.
"""

from __future__ import annotations

import json
import secrets
import urllib.parse
from datetime import datetime, timedelta, timezone
from typing import Any

import asyncpg
import pytest

from chime_worker import Context, Upstream
from chime_worker.store import Store, create_pool

from conftest import Env


async def insert_ended(env: Env, job: str, state: str, output: Any = None,
                       error: str | None = None, group: str | None = None
                       ) -> tuple[int, datetime]:
    """A manual run of `job` that ended `state` with `output` and `error`; its id and end."""
    finished = datetime.now(timezone.utc).replace(microsecond=123000)
    run_id = int(await env.db.fetchval(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state, "
        "output, error, started_at, finished_at) "
        "VALUES ($1, $2, $3, 'manual', 'null', $4, $5::jsonb, $6, $3, $7) RETURNING id",
        job, group or env.group, finished - timedelta(seconds=2), state,
        None if output is None else json.dumps(output), error, finished))
    return run_id, finished


async def insert_child(env: Env, job: str, upstream: int, state: str = "pending",
                       group: str | None = None) -> int:
    """A child run of `job` as `chime_advance` makes it: trigger `child`, `upstream_run_id`."""
    return int(await env.db.fetchval(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state, "
        "upstream_run_id) VALUES ($1, $2, now(), 'child', 'null', $3, $4) RETURNING id",
        job, group or env.group, state, upstream))


async def take_lease(env: Env) -> None:
    """The test's lease (holder `t`, term 1), as `Env.expand` takes it."""
    await env.db.execute("UPDATE chime_leader SET holder = 't', term = 1, "
                         "expires_at = now() + interval '1 hour' WHERE name = 'default'")


async def test_the_store_reads_a_child_runs_upstream_run_and_none_for_other_runs(
        env: Env) -> None:
    await env.insert_job("build")
    await env.insert_job("publish")
    await env.insert_kind_job("notify", "sharded", shards=2)
    output = {"artifact": "build-41.tar", "bytes": 1024, "city": "Zürich"}
    built, built_at = await insert_ended(env, "build", "succeeded", output)
    failed, failed_at = await insert_ended(env, "build", "failed", error="exit status 2")
    child = await insert_child(env, "publish", built)
    on_failure = await insert_child(env, "publish", failed)
    row = await env.task_row(child)
    assert row["trigger"] == "child" and row["upstream_run_id"] == built
    # A child job of kind sharded: its fire is the child run; its tasks read the same upstream.
    fire = await insert_child(env, "notify", built)
    await take_lease(env)
    tasks = await env.db.fetch("SELECT * FROM chime_expand_run('t', 1, $1)", fire)
    assert [t["task_key"] for t in tasks] == ["shard/0", "shard/1"]
    pool = await create_pool(env.db_url, 2)
    try:
        store = Store(pool)
        assert await store.upstream(child) == Upstream(built, "build", "succeeded", output,
                                                       None, built_at)
        got = await store.upstream(on_failure)
        assert got == Upstream(failed, "build", "failed", None, "exit status 2", failed_at)
        assert got is not None and got.finished_at is not None
        assert got.finished_at.tzinfo is not None
        for t in tasks:
            assert await store.upstream(t["id"]) == Upstream(built, "build", "succeeded",
                                                             output, None, built_at)
        assert await store.upstream(fire) == await store.upstream(child)
        # No other run made these: a manual run, a run of its own kind, and no run at all.
        assert await store.upstream(built) is None
        assert await store.upstream(await env.insert_run("publish")) is None
        assert await store.upstream(2**62) is None
    finally:
        await pool.close()


async def test_a_child_runs_handler_reads_its_upstream_through_ctx_parent(env: Env) -> None:
    """End to end: the upstream run's handler stores an output and succeeds on the worker; the
    leader's advance (here the test's, under its lease) makes the child run; its handler's
    `ctx.parent()` returns the upstream run. A manual run of the child job gets None."""
    await env.db.execute(
        "INSERT INTO chime_jobs (name, group_name, spec) VALUES ($1, $2, $3::jsonb)",
        "build", env.group, json.dumps({"every": "1h", "on_success": ["publish"]}))
    await env.insert_job("publish")
    w = env.worker()
    seen: dict[int, Upstream | None] = {}

    @w.handler("build")
    async def build(ctx: Context, params: Any) -> None:
        assert await ctx.parent() is None  # a manual run: nothing made it
        assert await ctx.set_output({"artifact": f"build-{ctx.run_id}.tar"})

    @w.handler("publish")
    async def publish(ctx: Context, params: Any) -> None:
        seen[ctx.run_id] = await ctx.parent()
        assert ctx.parent_run_id is None  # a child run is no task of its upstream run

    await env.start_worker(w)
    built = await env.trigger("build")
    upstream_row = await env.wait_run(built, "succeeded")
    assert await env.db.fetchval("SELECT count(*) FROM chime_advances WHERE run_id = $1",
                                 built) == 1
    await take_lease(env)
    made = await env.db.fetch("SELECT * FROM chime_advance('t', 1, 10)")
    assert [(m["upstream_id"], m["job_name"], m["state"], m["known"]) for m in made] == [
        (built, "publish", "pending", True)]
    child = int(made[0]["run_id"])
    row = await env.task_row(child)
    assert row["trigger"] == "child" and row["upstream_run_id"] == built
    await env.publish(env.trigger_body(child, "publish", None, scheduled_at=row["scheduled_at"]),
                      run_id=child, scheduled_at=row["scheduled_at"])
    await env.wait_run(child, "succeeded")
    manual = await env.trigger("publish")
    await env.wait_run(manual, "succeeded")
    assert seen == {
        child: Upstream(built, "build", "succeeded", {"artifact": f"build-{built}.tar"}, None,
                        upstream_row["finished_at"]),
        manual: None,
    }


async def test_a_worker_role_reads_the_upstream_of_its_groups_runs_only(env: Env) -> None:
    """`chime_upstream_runs` is granted to a worker role (chime_grant_worker) and checks the
    run's group (docs/protocol.md section 11): a run of another group is refused (42501)."""
    await env.insert_job("build")
    await env.insert_job("publish")
    await env.insert_job("theirs", group="another-group")
    built, built_at = await insert_ended(env, "build", "succeeded", [1, 2, 3])
    child = await insert_child(env, "publish", built)
    their_up, _ = await insert_ended(env, "theirs", "succeeded", group="another-group")
    theirs = await insert_child(env, "theirs", their_up, group="another-group")
    role = f"chime_py_{secrets.token_hex(5)}"
    await env.db.execute(f'CREATE ROLE "{role}" LOGIN')
    pool = None
    try:
        await env.db.execute("SELECT chime_grant_worker($1, $2, 'pytest')", role, env.group)
        url = urllib.parse.urlsplit(env.db_url)
        user_url = url._replace(netloc=f"{role}@{url.hostname}:{url.port or 5432}").geturl()
        pool = await create_pool(user_url, 1)
        store = Store(pool)
        assert await store.upstream(child) == Upstream(built, "build", "succeeded", [1, 2, 3],
                                                       None, built_at)
        with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError) as refused:
            await store.upstream(theirs)
        assert str(refused.value).startswith(
            f"role {role} may not act for executor group another-group (runs {theirs}); ")
    finally:
        if pool is not None:
            await pool.close()
        await env.db.execute(f'DROP OWNED BY "{role}"')
        await env.db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
        await env.db.execute(f'DROP ROLE IF EXISTS "{role}"')
