"""A message a consumer handed out, with the settles of its delivery: the same object on
HTTP and gRPC consumers (``client.consume(...)``).

    with client.consume("emails") as consumer:
        for message in consumer:
            send(message.json())
            message.ack()

``ack``, ``nack``, ``touch`` and ``reject`` send the delivery's token, so they settle this
delivery only: once its lease has run out and the message went to another consumer, they
raise StaleDelivery and change nothing. Each is one request, durable when it returns.
The asyncio consumers hand out :class:`AsyncDelivered`, whose settles are coroutines.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Protocol, Sequence

from doq_lib.errors import InvalidArgument
from doq_lib.models import Message


class Settler(Protocol):
    """What a delivered message settles through (both clients are)."""

    def ack(self, queue: str, id: int, delivery: str = "",
            enqueue: Sequence[dict[str, Any]] = ()) -> list[int]: ...

    def nack(self, queue: str, id: int, priority: int = 0,
             metadata: dict[str, str] | None = None, error: str = "", delay: int = 0,
             delivery: str = "", enqueue: Sequence[dict[str, Any]] = ()) -> Any: ...

    def touch(self, queue: str, id: int, delivery: str = "") -> None: ...

    def reject(self, queue: str, id: int, error: str = "", delivery: str = "",
               enqueue: Sequence[dict[str, Any]] = (), reason: str = "") -> list[int]: ...


class AsyncSettler(Protocol):
    """What an :class:`AsyncDelivered` settles through (both asyncio clients are)."""

    def ack(self, queue: str, id: int, delivery: str = "",
            enqueue: Sequence[dict[str, Any]] = ()) -> Awaitable[list[int]]: ...

    def nack(self, queue: str, id: int, priority: int = 0,
             metadata: dict[str, str] | None = None, error: str = "", delay: int = 0,
             delivery: str = "", enqueue: Sequence[dict[str, Any]] = ()) -> Awaitable[Any]: ...

    def touch(self, queue: str, id: int, delivery: str = "") -> Awaitable[None]: ...

    def reject(self, queue: str, id: int, error: str = "", delivery: str = "",
               enqueue: Sequence[dict[str, Any]] = (), reason: str = "",
               ) -> Awaitable[list[int]]: ...


@dataclass(frozen=True)
class DeliveredBase(Message):
    """What both kinds of delivered message have: the queue, and the content as JSON."""

    queue: str = ""

    def json(self) -> Any:
        """The content read as JSON."""
        return json.loads(self.content)


@dataclass(frozen=True)
class Delivered(DeliveredBase):
    """A delivered message (a :class:`~doq_lib.models.Message`) and its queue, settled
    through the client that took it."""

    settler: Settler | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, message: Message, queue: str, settler: Settler) -> Delivered:
        return cls(message.id, message.group, message.priority, message.content,
                   message.metadata, message.deliveries, message.last_error,
                   message.duplicate, message.expires_at, message.delivery, queue, settler)

    def _through(self) -> Settler:
        if self.settler is None:
            raise InvalidArgument("this message was not delivered by a consumer")
        return self.settler

    def ack(self, enqueue: Sequence[dict[str, Any]] = ()) -> list[int]:
        """Acknowledge this delivery; ``enqueue``: messages (``queue`` and the keyword
        arguments of ``client.enqueue``) stored with the ack, all or nothing. Returns their
        ids."""
        return self._through().ack(self.queue, self.id, self.delivery, enqueue)

    def nack(self, error: str = "", delay: int = 0, priority: int = 0,
             metadata: dict[str, str] | None = None,
             enqueue: Sequence[dict[str, Any]] = ()) -> bool:
        """Give it back: delivered again after ``delay`` seconds (0: at once, or after the
        queue's back-off); ``error`` is kept as its last_error. True when it was
        dead-lettered instead, its deliveries used up."""
        return bool(self._through().nack(self.queue, self.id, priority, metadata, error,
                                         delay, self.delivery, enqueue))

    def touch(self) -> None:
        """Extend the lease by the queue's ack timeout (StaleDelivery: it was lost)."""
        self._through().touch(self.queue, self.id, self.delivery)

    def reject(self, error: str = "", enqueue: Sequence[dict[str, Any]] = (),
               reason: str = "") -> list[int]:
        """Dead-letter it now (``reason``: its x-dead-reason, rejected by default, or
        retries_spent, unreadable); returns the ids stored with it."""
        return self._through().reject(self.queue, self.id, error, self.delivery, enqueue,
                                      reason)


@dataclass(frozen=True)
class AsyncDelivered(DeliveredBase):
    """:class:`Delivered` of an asyncio consumer: ``await message.ack()`` and so on."""

    settler: AsyncSettler | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, message: Message, queue: str, settler: AsyncSettler) -> AsyncDelivered:
        return cls(message.id, message.group, message.priority, message.content,
                   message.metadata, message.deliveries, message.last_error,
                   message.duplicate, message.expires_at, message.delivery, queue, settler)

    def _through(self) -> AsyncSettler:
        if self.settler is None:
            raise InvalidArgument("this message was not delivered by a consumer")
        return self.settler

    async def ack(self, enqueue: Sequence[dict[str, Any]] = ()) -> list[int]:
        """As :meth:`Delivered.ack`."""
        return await self._through().ack(self.queue, self.id, self.delivery, enqueue)

    async def nack(self, error: str = "", delay: int = 0, priority: int = 0,
                   metadata: dict[str, str] | None = None,
                   enqueue: Sequence[dict[str, Any]] = ()) -> bool:
        """As :meth:`Delivered.nack`."""
        return bool(await self._through().nack(self.queue, self.id, priority, metadata,
                                               error, delay, self.delivery, enqueue))

    async def touch(self) -> None:
        """As :meth:`Delivered.touch`."""
        await self._through().touch(self.queue, self.id, self.delivery)

    async def reject(self, error: str = "", enqueue: Sequence[dict[str, Any]] = (),
                     reason: str = "") -> list[int]:
        """As :meth:`Delivered.reject`."""
        return await self._through().reject(self.queue, self.id, error, self.delivery,
                                            enqueue, reason)
