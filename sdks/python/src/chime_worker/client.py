"""Triggering a run from code: `Client.trigger` (the database function `chime_trigger`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from .errors import ConfigError
from .protocol import MAX_NAME_BYTES, MAX_PARAMS_BYTES
from .secret_file import value_or_file


@dataclass(frozen=True)
class Triggered:
    run_id: int
    #: False when a run with the same idempotency key existed already (that run's id).
    created: bool


class Client:
    """A connection to Chime's database for triggering runs.

        async with Client() as chime:              # CHIME_DATABASE_URL (or its _FILE)
            run = await chime.trigger("send-report", {"day": "2026-12-01"})
    """

    def __init__(self, database_url: str | None = None, *, actor: str = "python-sdk") -> None:
        self.database_url = (database_url or value_or_file("CHIME_DATABASE_URL")
                             or "postgres://postgres@127.0.0.1:5432/chime")
        self.actor = actor
        self._conn: asyncpg.Connection | None = None

    async def __aenter__(self) -> "Client":
        self._conn = await asyncpg.connect(self.database_url)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def trigger(self, job: str, params: Any = None, *, at: datetime | None = None,
                      idempotency_key: str | None = None) -> Triggered:
        """Triggers a manual run of `job` with `params` (JSON; None: the job's own), due
        `at` (an aware datetime; None: now). The same `idempotency_key` returns the run
        it made before instead of a second one."""
        if not job or len(job.encode()) > MAX_NAME_BYTES:
            raise ConfigError(f"job name {job!r} must be 1 to {MAX_NAME_BYTES} bytes")
        if at is not None and at.tzinfo is None:
            raise ConfigError(f"at={at!r} has no time zone: pass an aware datetime")
        text = None if params is None else json.dumps(params)
        if text is not None and len(text.encode()) > MAX_PARAMS_BYTES:
            raise ConfigError(f"params are {len(text.encode())} bytes of JSON, over the limit "
                              f"of {MAX_PARAMS_BYTES}")
        if idempotency_key is not None and len(idempotency_key.encode()) > 255:
            raise ConfigError("idempotency_key is over 255 bytes: use a shorter key (a hash)")
        if self._conn is None:
            self._conn = await asyncpg.connect(self.database_url)
        row = await self._conn.fetchrow(
            "SELECT * FROM chime_trigger($1::text, $2::jsonb, $3::timestamptz, $4::text, "
            "$5::text)", job, text, at, idempotency_key, self.actor)
        assert row is not None
        return Triggered(int(row["run_id"]), bool(row["created"]))
