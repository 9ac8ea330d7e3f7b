"""The repository's hostile-input corpus (tests/corpus/amqp/) against the Python worker: each
case is published to a fresh group served by a worker with one handler, `corpus-job`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from chime_worker import Context
from chime_worker.protocol import rfc3339

from conftest import Env, LogCapture, wait_for

CORPUS = Path(__file__).resolve().parents[3] / "tests" / "corpus" / "amqp"
CASES = sorted(CORPUS.glob("*.json"))


@dataclass
class CorpusParams:
    size: int


def substitute(text: str, run_id: int | None, group: str, now: str, json_body: bool = False
               ) -> str:
    """The corpus placeholders filled in; in a JSON `body` the string "$RUN_ID" becomes the
    integer id, in a `raw_body` the text is replaced as it stands."""
    if run_id is not None:
        if json_body:
            text = text.replace('"$RUN_ID"', str(run_id))
        text = text.replace("$RUN_ID", str(run_id))
    text = text.replace("$GROUP", group).replace("$NOW", now)
    return re.sub(r"\$REPEAT\((.),(\d+)\)", lambda m: m.group(1) * int(m.group(2)), text)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
async def test_corpus_case(env: Env, sdk_log: LogCapture, path: Path) -> None:
    case = json.loads(path.read_text())
    w = env.worker(unhandled_wait=0)
    ran: list[int] = []

    @w.handler("corpus-job", params=CorpusParams)
    async def corpus_job(ctx: Context, p: CorpusParams) -> None:
        ran.append(ctx.run_id)

    await env.start_worker(w)
    run_id = None
    if "run" in case:
        spec = case["run"]
        group = spec.get("group", env.group)
        await env.insert_job(spec["job"], group=group)
        run_id = await env.insert_run(spec["job"], state=spec.get("state", "queued"),
                                      group=group)
        await env.db.execute("UPDATE chime_runs SET attempt = $2 WHERE id = $1", run_id,
                             spec.get("attempt", 0))  # test setup, as the scheduler left it
    now = rfc3339(datetime.now(timezone.utc))
    text = (json.dumps(case["body"]) if "body" in case else case["raw_body"])
    body = substitute(text, run_id, env.group, now, json_body="body" in case).encode()
    if "pad_body_to" in case:
        body += b" " * (case["pad_body_to"] - len(body))
    message_id = case.get("message_id")
    if message_id is not None:
        message_id = substitute(message_id, run_id, env.group, now)
    await env.publish(body, run_id=None, not_before=None, headers=case.get("headers", {}),
                      message_id=message_id)
    expect: dict[str, Any] = case["expect"]
    if "parked" in expect:
        parked = await env.get_message(env.topology.parking_queue)
        assert expect["parked"] in str(parked.headers["x-chime-dead-reason"])
        assert parked.body == body
    if "acked_log" in expect:
        await wait_for(f"log {expect['acked_log']!r}", lambda: _any(
            sdk_log.messages, expect["acked_log"]))
    if "run_state" in expect:
        assert run_id is not None
        run = await env.wait_run(run_id, expect["run_state"])
        if "run_error" in expect:
            assert expect["run_error"] in (run["error"] or "")
    assert ran == []


async def _any(messages: list[str], text: str) -> bool:
    return any(text in m for m in messages)
