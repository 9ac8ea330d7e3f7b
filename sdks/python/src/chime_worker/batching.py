"""Batched statements: claims (and outcomes) that arrive together go to PostgreSQL in one call.

A `Collector` sends one statement at a time: the first submission starts one, and those that
arrive while it runs wait and go together in the next, at most `max_batch` each. A lone
submission therefore costs one round trip, as it would alone, and a burst of hundreds (the
triggers published ahead of one instant) costs a few: the window is as long as the previous
statement takes, never a fixed delay. This is what the Rust SDK does (docs/protocol.md section
4, steps 4 and 7).

A caller whose batch failed gets `Failed` and does its statement alone: `maybe_ours` says that
the batch's commit may have happened with its reply lost.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Generic, Hashable, Sequence, TypeVar

log = logging.getLogger("chime_worker")

#: Items per statement at most (as the Rust SDK).
MAX_BATCH = 512

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Failed:
    """The batch carrying an item failed (or was never sent): do the item alone."""

    error: BaseException | None
    #: The statement may have committed with its reply lost.
    maybe_ours: bool


class Collector(Generic[T, R]):
    """Sends submitted items in batches through `send`, which answers one result per item, in
    order. `key` names an item's run: one item per key and statement (a second one waits for
    the next statement)."""

    def __init__(self, what: str, send: Callable[[list[T]], Awaitable[Sequence[R]]],
                 key: Callable[[T], Hashable], max_batch: int = MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch is {max_batch}; it must be at least 1")
        self.what = what
        self._send = send
        self._key = key
        self.max_batch = max_batch
        self._waiting: list[tuple[T, asyncio.Future[R | Failed]]] = []
        self._runner: asyncio.Task[None] | None = None
        #: Statements sent so far, and the most items one carried (the tests read them).
        self.statements = 0
        self.largest = 0

    async def submit(self, item: T) -> R | Failed:
        """`item`'s result from the statement that carried it, or `Failed`."""
        future: asyncio.Future[R | Failed] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._runner is None:
            self._runner = asyncio.create_task(self._run())
        return await future

    def _take(self) -> list[tuple[T, asyncio.Future[R | Failed]]]:
        batch: list[tuple[T, asyncio.Future[R | Failed]]] = []
        rest: list[tuple[T, asyncio.Future[R | Failed]]] = []
        keys: set[Hashable] = set()
        for entry in self._waiting:
            if entry[1].done():  # its caller went away
                continue
            key = self._key(entry[0])
            if len(batch) < self.max_batch and key not in keys:
                keys.add(key)
                batch.append(entry)
            else:
                rest.append(entry)
        self._waiting = rest
        return batch

    async def _run(self) -> None:
        batch: list[tuple[T, asyncio.Future[R | Failed]]] = []
        try:
            while self._waiting:
                batch = self._take()
                if not batch:
                    continue
                self.statements += 1
                self.largest = max(self.largest, len(batch))
                try:
                    results = list(await self._send([item for item, _ in batch]))
                    if len(results) != len(batch):
                        raise RuntimeError(f"{len(results)} results for {len(batch)} items")
                except Exception as e:
                    log.warning("batched %s of %d failed (%s); doing them one by one",
                                self.what, len(batch), e)
                    for _, future in batch:
                        if not future.done():
                            future.set_result(Failed(e, maybe_ours=True))
                else:
                    for (_, future), result in zip(batch, results):
                        if not future.done():
                            future.set_result(result)
                batch = []
        finally:
            # Cancelled (the loop is closing): nobody is left hanging.
            self._runner = None
            for _, future in batch:
                if not future.done():
                    future.set_result(Failed(None, maybe_ours=True))
            waiting, self._waiting = self._waiting, []
            for _, future in waiting:
                if not future.done():
                    future.set_result(Failed(None, maybe_ours=False))


__all__ = ["Collector", "Failed", "MAX_BATCH"]
