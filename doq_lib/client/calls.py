"""One definition of each client call for the blocking and the asyncio clients.

A call such as ``enqueue`` is written once, as a generator function (in
:mod:`doq_lib.client.http_calls` and :mod:`doq_lib.client.rpc_calls`): it builds the request,
yields it (an :class:`HttpCall` or an :class:`RpcCall`), receives the answer and returns the
result. It does no I/O. A client class turns it into a method with :func:`blocking` (the
method sends each request and waits) or :func:`awaiting` (a coroutine that awaits each one);
either way the method has the generator function's signature, arguments and result type,
and both clients get the same calls, checks and result parsing.

Errors travel the same way: when sending a request fails, the error is raised inside the
generator at its ``yield``, so a call may catch it (a per-id nack catching NotUnacked).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import (
    Any,
    Awaitable,
    Callable,
    Concatenate,
    Coroutine,
    Generator,
    ParamSpec,
    Protocol,
    TypeVar,
    cast,
)

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")
CallT = TypeVar("CallT", contravariant=True)


@dataclass(frozen=True, slots=True)
class HttpCall:
    """One REST request; the call receives its decoded JSON answer (None for 204).
    ``safe``: repeating it cannot change anything (a read); ``extra_time``: seconds the
    server may take beyond the usual (a long-poll)."""

    method: str
    path: str
    body: Any = None
    safe: bool = False
    extra_time: float = 0.0


@dataclass(frozen=True, slots=True)
class RpcCall:
    """One unary gRPC call by method name; the call receives the response message."""

    rpc: str
    request: Any
    safe: bool = False


#: A call: yields requests, receives their answers, returns its result.
Calls = Generator[Any, Any, R]


class Performs(Protocol[CallT]):
    """A blocking client: sends a request (with failover) and returns its answer."""

    def perform(self, call: CallT) -> Any: ...


class PerformsAsync(Protocol[CallT]):
    """An asyncio client: the same as a coroutine."""

    def perform(self, call: CallT) -> Awaitable[Any]: ...


def run(calls: Calls[R], perform: Callable[[Any], Any]) -> R:
    """Drive ``calls`` to its result, sending each request with ``perform``."""
    try:
        request = next(calls)
        while True:
            try:
                answer = perform(request)
            except Exception as exc:  # noqa: BLE001 - raised at the call's yield: it may catch it
                request = calls.throw(exc)
            else:
                request = calls.send(answer)
    except StopIteration as stop:
        return cast(R, stop.value)


async def run_async(calls: Calls[R], perform: Callable[[Any], Awaitable[Any]]) -> R:
    """:func:`run` for an asyncio client."""
    try:
        request = next(calls)
        while True:
            try:
                answer = await perform(request)
            except Exception as exc:  # noqa: BLE001 - as above
                request = calls.throw(exc)
            else:
                request = calls.send(answer)
    except StopIteration as stop:
        return cast(R, stop.value)


def blocking(fn: Callable[Concatenate[S, P], Calls[R]]) -> Callable[Concatenate[S, P], R]:
    """The method of a blocking client that runs the call ``fn``."""
    @functools.wraps(fn)
    def method(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return run(fn(self, *args, **kwargs), cast(Performs[Any], self).perform)
    return method


def awaiting(fn: Callable[Concatenate[S, P], Calls[R]],
             ) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """The coroutine method of an asyncio client that runs the call ``fn``."""
    @functools.wraps(fn)
    async def method(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await run_async(fn(self, *args, **kwargs),
                               cast(PerformsAsync[Any], self).perform)
    return method
