"""Workflow nodes against the real PostgreSQL (and RabbitMQ for the worker's path): a node's
run reads the latest ended run of another node of its workflow run (`chime_upstream_runs`, the
rows with `node` set) through the store and through `ctx.upstream(node)`; `ctx.parent()` stays
the row with `node` NULL.

The tests act as the leader where it is needed: a workflow run and its node runs are inserted
as the leader's advance makes them (trigger `workflow`, `workflow_run_id`, `node`,
`node_round`), a sharded node's run is expanded by `chime_expand_run` under the test's lease,
and a node run's trigger is published as any run's.
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


async def insert_workflow_run(env: Env, workflow: str = "nightly-etl",
                              group: str | None = None) -> int:
    """A running manual run of workflow job `workflow`, as the leader starts it."""
    return int(await env.db.fetchval(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state, "
        "started_at) VALUES ($1, $2, now(), 'manual', 'null', 'running', now()) RETURNING id",
        workflow, group or env.group))


async def insert_node(env: Env, workflow_run: int, node: str, job: str, state: str = "queued",
                      round: int = 1, output: Any = None, error: str | None = None,
                      group: str | None = None) -> tuple[int, datetime | None]:
    """A run of `job` as node `node` (round `round`) of `workflow_run`, as the leader's advance
    makes it, in `state` (ended with `output` and `error` when the state is final); its id and
    end."""
    ended = state in ("succeeded", "failed", "dead", "cancelled", "skipped", "lost")
    finished = datetime.now(timezone.utc).replace(microsecond=456000) if ended else None
    run_id = int(await env.db.fetchval(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state, "
        "output, error, started_at, finished_at, workflow_run_id, node, node_round) "
        "VALUES ($1, $2, now() - interval '5 seconds', 'workflow', 'null', $3, $4::jsonb, $5, "
        "CASE WHEN $3 = 'skipped' THEN NULL ELSE now() - interval '2 seconds' END, $6, $7, "
        "$8, $9) RETURNING id",
        job, group or env.group, state, None if output is None else json.dumps(output), error,
        finished, workflow_run, node, round))
    return run_id, finished


async def take_lease(env: Env) -> None:
    """The test's lease (holder `t`, term 1), as `Env.expand` takes it."""
    await env.db.execute("UPDATE chime_leader SET holder = 't', term = 1, "
                         "expires_at = now() + interval '1 hour' WHERE name = 'default'")


async def test_the_store_reads_each_nodes_latest_ended_run_and_parent_the_child_row(
        env: Env) -> None:
    for job in ("nightly-etl", "extract-orders", "clean-orders", "page-oncall", "export"):
        await env.insert_job(job)
    await env.insert_kind_job("load-warehouse", "sharded", shards=2)
    wf = await insert_workflow_run(env)
    first, _ = await insert_node(env, wf, "extract", "extract-orders", "failed",
                                 error="timed out")
    output = {"rows": 1200, "city": "Zürich"}
    extract, extract_at = await insert_node(env, wf, "extract", "extract-orders", "succeeded",
                                            round=2, output=output)
    alert, alert_at = await insert_node(env, wf, "alert", "page-oncall", "skipped")
    await insert_node(env, wf, "clean", "clean-orders", "running")
    load, _ = await insert_node(env, wf, "load", "load-warehouse", "pending")
    # A sharded node's run is a fire like any: its tasks read its workflow run's nodes.
    await take_lease(env)
    tasks = await env.db.fetch("SELECT * FROM chime_expand_run('t', 1, $1)", load)
    assert [t["task_key"] for t in tasks] == ["shard/0", "shard/1"]
    rows = [await env.task_row(t["id"]) for t in tasks]
    assert {(r["trigger"], r["parent_id"], r["node"]) for r in rows} == {("workflow", load, None)}
    # A child run of a manual export, to show `parent` reads that row and no node's.
    export = int(await env.db.fetchval(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state, "
        "finished_at) VALUES ('export', $1, now(), 'manual', 'null', 'succeeded', now()) "
        "RETURNING id", env.group))
    child = int(await env.db.fetchval(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state, "
        "upstream_run_id) VALUES ('clean-orders', $1, now(), 'child', 'null', 'pending', $2) "
        "RETURNING id", env.group, export))
    pool = await create_pool(env.db_url, 2)
    try:
        store = Store(pool)
        want = Upstream(extract, "extract-orders", "succeeded", output, None, extract_at,
                        "extract")
        assert first < extract
        for reader in [load, *(t["id"] for t in tasks)]:
            got = await store.upstream(reader, "extract")
            assert got == want, reader
            assert got is not None and got.finished_at is not None
            assert got.finished_at.tzinfo is not None
            assert await store.upstream(reader, "alert") == Upstream(
                alert, "page-oncall", "skipped", None, None, alert_at, "alert")
            # Not ended, its own node, and no such node: none.
            for none in ("clean", "load", "nope", ""):
                assert await store.upstream(reader, none) is None, none
            assert await store.upstream(reader) is None  # no run made it: no `node` NULL row
        # The child run reads its upstream run as `parent`, and no node.
        parent = await store.upstream(child)
        assert parent is not None and (parent.run_id, parent.node) == (export, None)
        assert await store.upstream(child, "extract") is None
        # Runs of no workflow read no node; a workflow run itself none of its own nodes.
        for run in (export, wf, 2**62):
            assert await store.upstream(run, "extract") is None
    finally:
        await pool.close()


async def test_a_node_runs_handler_reads_the_nodes_before_it_through_ctx_upstream(
        env: Env) -> None:
    """End to end: node `extract`'s run has ended with an output; node `clean`'s run is
    published as the leader publishes it, and its handler's `ctx.upstream("extract")` returns
    extract's run, `ctx.parent()` None. A manual run of the same job reads no node."""
    for job in ("nightly-etl", "extract-orders", "clean-orders"):
        await env.insert_job(job)
    wf = await insert_workflow_run(env)
    extract, extract_at = await insert_node(env, wf, "extract", "extract-orders", "succeeded",
                                            output={"rows": 3})
    w = env.worker()
    seen: dict[int, tuple[Upstream | None, Upstream | None, Upstream | None]] = {}

    @w.handler("clean-orders")
    async def clean(ctx: Context, params: Any) -> None:
        seen[ctx.run_id] = (await ctx.upstream("extract"), await ctx.upstream("clean"),
                            await ctx.parent())
        up = seen[ctx.run_id][0]
        if up is not None:
            assert await ctx.set_output({"cleaned": up.output["rows"]})

    await env.start_worker(w)
    clean_run, _ = await insert_node(env, wf, "clean", "clean-orders", "queued")
    at = datetime.now(timezone.utc) - timedelta(seconds=1)
    await env.publish(env.trigger_body(clean_run, "clean-orders", None, scheduled_at=at),
                      run_id=clean_run, scheduled_at=at)
    row = await env.wait_run(clean_run, "succeeded")
    assert json.loads(row["output"]) == {"cleaned": 3}
    manual = await env.trigger("clean-orders")
    await env.wait_run(manual, "succeeded")
    assert seen == {
        clean_run: (Upstream(extract, "extract-orders", "succeeded", {"rows": 3}, None,
                             extract_at, "extract"), None, None),
        manual: (None, None, None),
    }
    # The node run's end queued its workflow run's advance (the leader's to take).
    assert await env.db.fetchval(
        "SELECT count(*) FROM chime_workflow_advances WHERE run_id = $1", wf) == 1


async def test_a_worker_role_reads_the_nodes_of_its_groups_runs_only(env: Env) -> None:
    """`chime_upstream_runs`, redefined for workflows, is still the worker role's
    (chime_grant_worker; a security definer) and checks the run's group: a node run of another
    group is refused (42501)."""
    for job in ("nightly-etl", "extract-orders", "clean-orders"):
        await env.insert_job(job)
    await env.insert_job("theirs", group="another-group")
    wf = await insert_workflow_run(env)
    extract, extract_at = await insert_node(env, wf, "extract", "extract-orders", "succeeded",
                                            output=[1, 2, 3])
    clean, _ = await insert_node(env, wf, "clean", "clean-orders", "running")
    their_wf = await insert_workflow_run(env, "theirs", group="another-group")
    await insert_node(env, their_wf, "extract", "theirs", "succeeded", group="another-group")
    theirs, _ = await insert_node(env, their_wf, "clean", "theirs", "running",
                                  group="another-group")
    role = f"chime_py_{secrets.token_hex(5)}"
    await env.db.execute(f'CREATE ROLE "{role}" LOGIN')
    pool = None
    try:
        await env.db.execute("SELECT chime_grant_worker($1, $2, 'pytest')", role, env.group)
        url = urllib.parse.urlsplit(env.db_url)
        user_url = url._replace(netloc=f"{role}@{url.hostname}:{url.port or 5432}").geturl()
        pool = await create_pool(user_url, 1)
        store = Store(pool)
        assert await store.upstream(clean, "extract") == Upstream(
            extract, "extract-orders", "succeeded", [1, 2, 3], None, extract_at, "extract")
        with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError) as refused:
            await store.upstream(theirs, "extract")
        assert str(refused.value).startswith(
            f"role {role} may not act for executor group another-group (runs {theirs}); ")
    finally:
        if pool is not None:
            await pool.close()
        await env.db.execute(f'DROP OWNED BY "{role}"')
        await env.db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
        await env.db.execute(f'DROP ROLE IF EXISTS "{role}"')
