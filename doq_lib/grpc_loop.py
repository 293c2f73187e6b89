"""The threads' plumbing of gRPC's thread mode (L5, for :mod:`doq_lib.grpc_thread`): real OS
threads in a monkey-patched process, the gRPC thread's own epoll selector, and
:class:`HubBridge`, the hand-off of calls from the gRPC thread to the hub.
"""
from __future__ import annotations

import asyncio
import logging
import selectors
import threading
import types
from typing import Any, Callable, Iterable

import gevent
from gevent import monkey

# grpc_thread's logger: its records keep the name they had before this module was split out.
log = logging.getLogger("doq_lib.grpc_thread")

_real_start_thread = monkey.get_original("_thread", "start_new_thread")
_real_lock = monkey.get_original("_thread", "allocate_lock")
_EPOLLIN, _EPOLLOUT = 0x001, 0x004


# -- real OS threads in a monkey-patched process ---------------------------------------------------
class OsThread:
    """The part of ``threading.Thread`` grpcio uses, on a real OS thread (gevent's
    ``threading`` would give a greenlet, which never runs outside the hub's thread)."""

    def __init__(self, group: Any = None, target: Callable[..., Any] | None = None,
                 name: str | None = None, args: Iterable[Any] = (),
                 kwargs: dict[str, Any] | None = None, *, daemon: bool | None = None) -> None:
        self._target, self._args, self._kwargs = target, tuple(args), kwargs or {}
        self.name, self.daemon = name or "grpc-os-thread", daemon
        self._done = _real_lock()
        self._done.acquire()
        self._alive = False

    def start(self) -> None:
        self._alive = True
        _real_start_thread(self._run, ())

    def _run(self) -> None:
        try:
            if self._target is not None:
                self._target(*self._args, **self._kwargs)
        except BaseException:  # noqa: BLE001 - a thread's last word
            log.exception("%s failed", self.name)
        finally:
            self._alive = False
            self._done.release()

    def join(self, timeout: float | None = None) -> None:
        if self._done.acquire(True, -1 if timeout is None else timeout):
            self._done.release()

    def is_alive(self) -> bool:
        return self._alive


class _ThreadingForGrpc(types.ModuleType):
    """``threading`` as grpcio's Cython module sees it: real threads, the rest as is."""

    Thread = OsThread

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)


def _grpc_uses_os_threads() -> None:
    from grpc._cython import cygrpc
    if not isinstance(cygrpc.threading, _ThreadingForGrpc):
        cygrpc.threading = _ThreadingForGrpc("threading")


class _Epoll(selectors._PollLikeSelector):  # type: ignore[name-defined,misc]
    """An epoll selector on the original ``select.epoll`` (gevent removes it from
    ``select``), for the gRPC thread's asyncio loop."""

    _selector_cls = monkey.get_original("select", "epoll")
    _selector: Any                       # set by _PollLikeSelector
    _fd_to_key: dict[int, Any]
    _EVENT_READ = _EPOLLIN
    _EVENT_WRITE = _EPOLLOUT

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        if timeout is None:
            timeout = -1
        elif timeout <= 0:
            timeout = 0
        else:
            timeout = max(timeout, 1e-3)
        ready: list[tuple[Any, int]] = []
        try:
            events = self._selector.poll(timeout, max(len(self._fd_to_key), 1))
        except InterruptedError:
            return ready
        for fd, event in events:
            mask = 0
            if event & ~_EPOLLIN:
                mask |= selectors.EVENT_WRITE
            if event & ~_EPOLLOUT:
                mask |= selectors.EVENT_READ
            key = self._fd_to_key.get(fd)
            if key:
                ready.append((key, mask & key.events))
        return ready

    def fileno(self) -> int:
        return int(self._selector.fileno())

    def close(self) -> None:
        self._selector.close()
        super().close()


# -- the hand-off --------------------------------------------------------------------------------
def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class HubBridge:
    """Calls from the gRPC thread into the hub (the gevent loop's thread)."""

    def __init__(self) -> None:
        self._hub_loop = gevent.get_hub().loop          # created in the hub's thread

    def call(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any],
             *args: Any) -> asyncio.Future[Any]:
        """(gRPC thread) Run ``fn(*args)`` in a new greenlet; its result or exception comes
        back as the returned future's."""
        future = loop.create_future()
        self._hub_loop.run_callback_threadsafe(self._spawn, loop, future, fn, args)
        return future

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """(any thread) Run ``fn(*args)`` in the hub soon; it must not block."""
        self._hub_loop.run_callback_threadsafe(fn, *args)

    @staticmethod
    def _spawn(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any],
               fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        gevent.spawn(HubBridge._run, loop, future, fn, args)

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any],
             fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(_resolve, future, result, error)
        except RuntimeError:                  # the gRPC thread's loop is closed: shut down
            pass
