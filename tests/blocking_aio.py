"""The asyncio client driven as a blocking one, so that the client tests run unchanged on it:
each coroutine method runs on an event loop in a thread of its own, and consumers and
delivered messages come back wrapped the same way. Every call still goes through the
asyncio client's own code (aiohttp, grpc.aio) on a real event loop."""
from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any, Coroutine

from doq_lib.client.aio_consumers import AsyncSubscription
from doq_lib.client.delivered import AsyncDelivered


class LoopThread:
    """An event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="test-aio-loop")
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Blocking:
    """An asyncio client (or consumer, or delivered message) used as a blocking one."""

    def __init__(self, target: Any, loop: LoopThread) -> None:
        self.target = target
        self._loop = loop

    def _wrap(self, result: Any) -> Any:
        if isinstance(result, (AsyncSubscription, AsyncDelivered)):
            return Blocking(result, self._loop)
        if isinstance(result, list) and result and isinstance(result[0], AsyncDelivered):
            return [Blocking(r, self._loop) for r in result]
        return result

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.target, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            result = value(*args, **kwargs)
            if inspect.isawaitable(result):
                result = self._loop.run(result)
            return self._wrap(result)
        return call

    def __eq__(self, other: object) -> bool:
        return bool(self.target == (other.target if isinstance(other, Blocking) else other))

    def __hash__(self) -> int:
        return hash(self.target)

    def __iter__(self) -> Blocking:
        return self

    def __next__(self) -> Any:
        try:
            return self._wrap(self._loop.run(self.target.__anext__()))
        except StopAsyncIteration:
            raise StopIteration from None

    def __enter__(self) -> Blocking:
        self._loop.run(self.target.__aenter__())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._loop.run(self.target.__aexit__(*exc))


def connect_blocking(loop: LoopThread, *args: Any, **kwargs: Any) -> Blocking:
    """``connect_async(...)`` on ``loop``, wrapped."""
    from doq_lib.client.aio import connect_async
    return Blocking(loop.run(connect_async(*args, **kwargs)), loop)


_shared: LoopThread | None = None


def shared_loop() -> LoopThread:
    """One event loop thread for the whole test session (started when first needed)."""
    global _shared
    if _shared is None:
        _shared = LoopThread()
    return _shared


def open_client(urls: Any, kind: str, **options: Any) -> Any:
    """A blocking client (kind ``http`` or ``grpc``) or an asyncio one driven on the shared
    loop (``http-async``, ``grpc-async``), with ``connect``'s options."""
    from doq_lib.client import connect
    transport, _, mode = kind.partition("-")
    if mode == "async":
        return connect_blocking(shared_loop(), urls, transport=transport, **options)
    return connect(urls, transport=transport, **options)


#: Every kind of client, for tests that run on each.
KINDS = ("http", "grpc", "http-async", "grpc-async")
