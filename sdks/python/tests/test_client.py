"""`Client.trigger` against the database function `chime_trigger`, and the run it makes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from chime_worker import Client, ConfigError

from conftest import Env, later


async def test_trigger_creates_a_run_once_per_idempotency_key(env: Env) -> None:
    await env.insert_job("report")
    at = later(3600)
    async with Client(env.db_url, actor="tests") as chime:
        first = await chime.trigger("report", {"day": "2026-12-01"}, at=at,
                                    idempotency_key="report-2026-12-01")
        again = await chime.trigger("report", {"day": "2026-12-01"}, at=at,
                                    idempotency_key="report-2026-12-01")
        other = await chime.trigger("report")
        with pytest.raises(ConfigError):
            await chime.trigger("report", at=at.replace(tzinfo=None))
    assert first.created and not again.created and again.run_id == first.run_id
    assert other.created and other.run_id != first.run_id
    run = await env.db.fetchrow("SELECT * FROM chime_runs WHERE id = $1", first.run_id)
    assert run["job_name"] == "report" and run["group_name"] == env.group
    assert run["trigger"] == "manual" and run["params"] == '{"day": "2026-12-01"}'
    assert abs(run["scheduled_at"] - at) < timedelta(milliseconds=1)
