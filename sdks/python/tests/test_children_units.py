"""Child jobs without services: `ctx.parent()` through the testing helper."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

import pytest

import chime_worker
from chime_worker import Context, JobLogger, Shard, TaskCallError, Upstream
from chime_worker.testing import RecordingTaskCalls, run_handler

ENDED = datetime(2026, 12, 3, 10, 30, tzinfo=timezone.utc)


async def publish(ctx: Context, params: Any) -> None:
    """A child job's handler: publishes what the upstream build made, or says why not."""
    up = await ctx.parent()
    if up is None:
        ctx.log.info("not started by another run: nothing to publish")
        return
    if up.state != "succeeded":
        ctx.log.warn(f"build run {up.run_id} of {up.job} ended {up.state}: {up.error}")
        return
    ctx.log.info(f"publishing {up.output['artifact']} of run {up.run_id} "
                 f"(ended {up.finished_at:%H:%M})")
    await ctx.set_output({"published": up.output["artifact"]})


async def test_the_testing_helper_gives_ctx_parent_the_upstream_run() -> None:
    upstream = Upstream(41, "build", "succeeded", output={"artifact": "build-41.tar"},
                        finished_at=ENDED)
    run = await run_handler(publish, parent=upstream)
    assert run.ok, run.error
    assert run.logs == [("info", "publishing build-41.tar of run 41 (ended 10:30)")]
    assert run.output == {"published": "build-41.tar"}

    failed = await run_handler(publish, parent=Upstream(42, "build", "dead",
                                                        error="exit status 2"))
    assert failed.ok and failed.logs == [
        ("warn", "build run 42 of build ended dead: exit status 2")]


async def test_ctx_parent_is_none_without_an_upstream_run() -> None:
    run = await run_handler(publish)
    assert run.ok and run.logs == [("info", "not started by another run: nothing to publish")]
    assert run.outputs == []


async def test_a_task_of_a_child_fire_reads_the_fires_upstream_not_its_parent_run() -> None:
    seen: list[tuple[Upstream | None, int | None]] = []

    async def shard(ctx: Context, params: Any) -> None:
        seen.append((await ctx.parent(), ctx.parent_run_id))

    upstream = Upstream(7, "extract", "succeeded")
    assert (await run_handler(shard, shard=Shard(0, 2), parent=upstream)).ok
    assert seen == [(upstream, 100)]  # the upstream run, and apart from it the task's fire


def test_upstream_is_exported_and_its_optional_fields_default_to_none() -> None:
    assert "Upstream" in chime_worker.__all__ and chime_worker.Upstream is Upstream
    up = Upstream(1, "a", "failed")
    assert (up.output, up.error, up.finished_at) == (None, None, None)
    with pytest.raises(AttributeError):
        up.state = "succeeded"  # type: ignore[misc]  # frozen, as TaskResult


async def test_ctx_parent_without_a_worker_names_the_fix() -> None:
    ctx = Context(run_id=1, job="j", attempt=1, scheduled_at=datetime.now(timezone.utc),
                  params=None, log=JobLogger(), cancelled=asyncio.Event())
    with pytest.raises(TaskCallError, match="ctx.parent: this context has no worker behind it"):
        await ctx.parent()
    calls = RecordingTaskCalls(parent=Upstream(3, "b", "succeeded"))
    ctx = Context(run_id=1, job="j", attempt=1, scheduled_at=datetime.now(timezone.utc),
                  params=None, log=JobLogger(), cancelled=asyncio.Event(), calls=calls)
    assert await ctx.parent() == Upstream(3, "b", "succeeded")
