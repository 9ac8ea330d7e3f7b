"""Workflow nodes without services: `ctx.upstream(node)` through the testing helper."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

import pytest

from chime_worker import Context, JobLogger, Shard, TaskCallError, Upstream
from chime_worker.testing import RecordingTaskCalls, run_handler

ENDED = datetime(2026, 12, 4, 2, 10, tzinfo=timezone.utc)


async def clean(ctx: Context, params: Any) -> None:
    """A workflow node's handler: cleans what node `extract` extracted, or says why not."""
    extract = await ctx.upstream("extract")
    if extract is None:
        ctx.log.info("not a node after extract: nothing to clean")
        return
    if extract.state != "succeeded":
        ctx.log.warn(f"extract run {extract.run_id} of {extract.job} ended {extract.state}: "
                     f"{extract.error}")
        return
    ctx.log.info(f"cleaning {extract.output['rows']} rows of run {extract.run_id} "
                 f"(node {extract.node}, ended {extract.finished_at:%H:%M})")
    await ctx.set_output({"cleaned": extract.output["rows"]})


async def test_the_testing_helper_gives_ctx_upstream_the_node_runs() -> None:
    extract = Upstream(51, "extract-orders", "succeeded", output={"rows": 1200},
                       finished_at=ENDED)
    run = await run_handler(clean, upstream={"extract": extract})
    assert run.ok, run.error
    assert run.logs == [("info", "cleaning 1200 rows of run 51 (node extract, ended 02:10)")]
    assert run.output == {"cleaned": 1200}

    failed = await run_handler(clean, upstream={
        "extract": Upstream(52, "extract-orders", "dead", error="exit status 2")})
    assert failed.ok and failed.logs == [
        ("warn", "extract run 52 of extract-orders ended dead: exit status 2")]


async def test_ctx_upstream_is_none_without_the_node() -> None:
    run = await run_handler(clean)
    assert run.ok and run.logs == [("info", "not a node after extract: nothing to clean")]
    other = await run_handler(clean, upstream={"load": Upstream(9, "load", "succeeded")})
    assert other.ok and other.logs == run.logs
    assert run.outputs == other.outputs == []


async def test_each_node_reads_its_own_run_with_node_set_and_parent_none_of_them() -> None:
    seen: list[tuple[Upstream | None, ...]] = []

    async def load(ctx: Context, params: Any) -> None:
        seen.append((await ctx.upstream("extract"), await ctx.upstream("clean"),
                     await ctx.upstream("load"), await ctx.parent()))

    extract = Upstream(1, "extract-orders", "failed", error="timed out")
    clean_run = Upstream(2, "clean-orders", "skipped")
    assert (await run_handler(load, upstream={"extract": extract, "clean": clean_run})).ok
    assert seen == [(Upstream(1, "extract-orders", "failed", error="timed out",
                              node="extract"),
                     Upstream(2, "clean-orders", "skipped", node="clean"), None, None)]
    assert extract.node is None  # the test's own value is left as it was

    # A child job's upstream run is no node's: `upstream` does not read it, `parent` does.
    seen.clear()
    parent = Upstream(41, "export", "succeeded")
    assert (await run_handler(load, parent=parent)).ok
    assert seen == [(None, None, None, parent)]


async def test_a_task_of_a_node_run_reads_the_nodes_not_its_parent_run() -> None:
    seen: list[tuple[Upstream | None, int | None]] = []

    async def shard(ctx: Context, params: Any) -> None:
        seen.append((await ctx.upstream("extract"), ctx.parent_run_id))

    extract = Upstream(7, "extract-orders", "succeeded")
    assert (await run_handler(shard, shard=Shard(0, 2), upstream={"extract": extract})).ok
    assert seen == [(Upstream(7, "extract-orders", "succeeded", node="extract"), 100)]


def test_upstream_node_defaults_to_none_and_comes_last() -> None:
    up = Upstream(1, "a", "succeeded", None, None, ENDED)
    assert up.node is None
    assert Upstream(1, "a", "succeeded", None, None, ENDED, "n").node == "n"


async def test_ctx_upstream_without_a_worker_or_a_name_names_the_fix() -> None:
    ctx = Context(run_id=1, job="j", attempt=1, scheduled_at=datetime.now(timezone.utc),
                  params=None, log=JobLogger(), cancelled=asyncio.Event())
    with pytest.raises(TaskCallError,
                       match="ctx.upstream: this context has no worker behind it"):
        await ctx.upstream("extract")
    calls = RecordingTaskCalls(upstream={"extract": Upstream(3, "b", "succeeded")})
    ctx = Context(run_id=1, job="j", attempt=1, scheduled_at=datetime.now(timezone.utc),
                  params=None, log=JobLogger(), cancelled=asyncio.Event(), calls=calls)
    assert await ctx.upstream("extract") == Upstream(3, "b", "succeeded", node="extract")
    assert await ctx.upstream("clean") is None
    assert await ctx.parent() is None
    with pytest.raises(TaskCallError, match="ctx.upstream: node 3 is not a node name"):
        await ctx.upstream(3)  # type: ignore[arg-type]
