"""RabbitMQ: the topology, confirmed mandatory publishes (retries, tiers, parking), the consumer.

The only module that uses aio-pika. A publish counts only when the broker acks it without
returning it (`on_return_raises`): a return (unroutable) or a nack raises `PublishFailed`.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any, Mapping

import aio_pika
import aiormq
from aio_pika.abc import (AbstractChannel, AbstractExchange, AbstractIncomingMessage,
                          AbstractRobustConnection)

from .protocol import (CONTENT_TYPE, HEADER_DEAD_BY, HEADER_DEAD_REASON, HEADER_ERROR,
                       HEADER_PARKED_AT, PARKING_KEY, RETRY_TIERS, WORK_KEY, Tier, Topology,
                       cap_header_value, copied_headers)


class PublishFailed(Exception):
    """The broker did not confirm a publish (returned, nacked, or the channel failed);
    `returned` when the broker returned it: no queue is bound to its routing key."""

    def __init__(self, message: str, *, returned: bool = False) -> None:
        super().__init__(message)
        self.returned = returned


class Broker:
    def __init__(self, url: str, topology: Topology, connection_name: str) -> None:
        self.url = url
        self.topology = topology
        self.connection_name = connection_name
        self.connection: AbstractRobustConnection | None = None
        self._publish_channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._declared_tiers: set[str] = set()
        self._lock = asyncio.Lock()

    async def connect(self) -> None:
        self.connection = await aio_pika.connect_robust(
            self.url, client_properties={"connection_name": self.connection_name})
        channel = await self.connection.channel(publisher_confirms=True)
        await declare_base(channel, self.topology)
        await channel.close()
        await self._open_publisher()

    async def _open_publisher(self) -> None:
        assert self.connection is not None
        self._publish_channel = await self.connection.channel(publisher_confirms=True,
                                                              on_return_raises=True)
        self._exchange = await self._publish_channel.get_exchange(self.topology.exchange,
                                                                  ensure=False)

    async def close(self) -> None:
        # The worker's own queue stays (durable): a worker restarted under the same id finds
        # its broadcast tasks there. RabbitMQ (3.10) refuses `queue.delete` with `if-empty` on
        # a quorum queue (it closes the connection, 540 NOT_IMPLEMENTED), and a delete after
        # reading the queue empty could drop a task published in between.
        if self.connection is not None:
            await self.connection.close()

    async def _ensure_tier(self, tier: Tier) -> None:
        if tier.name in self._declared_tiers:
            return
        assert self.connection is not None
        channel = await self.connection.channel()
        try:
            queue = await channel.declare_queue(
                self.topology.retry_queue(tier), durable=True,
                arguments=self.topology.retry_queue_arguments(tier))
            await queue.bind(self.topology.exchange, tier.routing_key)
        finally:
            await channel.close()
        self._declared_tiers.add(tier.name)

    async def publish(self, routing_key: str, body: bytes, *, headers: Mapping[str, Any],
                      message_id: str | None, timestamp: datetime | None,
                      content_type: str | None = CONTENT_TYPE) -> None:
        """Publishes persistent and mandatory to the group's exchange and waits for the
        confirm; raises PublishFailed unless the broker acked it without a return."""
        for tier in RETRY_TIERS:
            if routing_key == tier.routing_key:
                await self._ensure_tier(tier)
        message = aio_pika.Message(
            body, headers=dict(headers), content_type=content_type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id=message_id,
            timestamp=timestamp)
        try:
            async with self._lock:
                if self._publish_channel is None or self._publish_channel.is_closed:
                    await self._open_publisher()
                exchange = self._exchange
            assert exchange is not None
            confirm = await exchange.publish(message, routing_key, mandatory=True,
                                             timeout=30)
        except aiormq.exceptions.PublishError as e:
            raise PublishFailed(f"publish to {self.topology.exchange} with key {routing_key} "
                                "returned by the broker: no queue is bound to that key",
                                returned=True) from e
        except (aio_pika.exceptions.AMQPError, aiormq.exceptions.AMQPError,
                asyncio.TimeoutError, ConnectionError, RuntimeError) as e:
            raise PublishFailed(f"publish to {self.topology.exchange} with key "
                                f"{routing_key} not confirmed: {e!r}") from e
        if not isinstance(confirm, aiormq.spec.Basic.Ack):
            raise PublishFailed(f"publish to {self.topology.exchange} with key {routing_key} "
                                f"not confirmed: {confirm!r}")

    async def declare_worker_queue(self, worker_id: str) -> str:
        """Declares worker `worker_id`'s own queue `P.G.worker.<id>` (durable, the work
        queue's arguments and `x-expires`) bound with `worker.<id>`: its broadcast tasks.
        Returns its name."""
        assert self.connection is not None
        name = self.topology.worker_queue(worker_id)
        channel = await self.connection.channel()
        try:
            queue = await channel.declare_queue(
                name, durable=True, arguments=self.topology.worker_queue_arguments())
            await queue.bind(self.topology.exchange, self.topology.worker_key(worker_id))
        finally:
            await channel.close()
        return name

    async def copy(self, message: AbstractIncomingMessage, routing_key: str, *,
                   body: bytes | None = None, extra: Mapping[str, Any] | None = None) -> None:
        """A copy of `message` (its headers minus the broker's and the parking ones)."""
        headers = copied_headers(message.headers or {})
        headers.update(extra or {})
        await self.publish(routing_key, message.body if body is None else body,
                           headers=headers, message_id=message.message_id,
                           timestamp=message.timestamp, content_type=message.content_type)

    async def park(self, message: AbstractIncomingMessage, reason: str, by: str,
                   error: str | None = None) -> None:
        """Parks a copy of `message` with the reason (section 6)."""
        extra: dict[str, Any] = {
            HEADER_DEAD_REASON: cap_header_value(reason),
            HEADER_DEAD_BY: cap_header_value(by),
            HEADER_PARKED_AT: int(datetime.now(timezone.utc).timestamp() * 1000),
        }
        if error is not None:
            extra[HEADER_ERROR] = cap_header_value(error)
        await self.copy(message, PARKING_KEY, extra=extra)


async def declare_base(channel: AbstractChannel, topology: Topology) -> None:
    """The exchange, work queue and parking lot every worker declares at start."""
    exchange = await channel.declare_exchange(topology.exchange, aio_pika.ExchangeType.DIRECT,
                                              durable=True)
    work = await channel.declare_queue(topology.work_queue, durable=True,
                                       arguments=topology.work_queue_arguments())
    await work.bind(exchange, WORK_KEY)
    parking = await channel.declare_queue(topology.parking_queue, durable=True,
                                          arguments=topology.parking_queue_arguments())
    await parking.bind(exchange, PARKING_KEY)
