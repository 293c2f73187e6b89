"""gRPC served from its own OS thread, inside the node's gevent process (L5).

In gevent mode (``grpc.serving = gevent``) grpcio hands every completion event (a message
received, a message sent, a call started or ended) to the hub's thread pool and back, which
caps a node at a few thousand gRPC events a second whatever the handlers do. Here
(``grpc.serving = thread``, the default) grpcio runs as in any plain program:

* one **gRPC thread**, a real OS thread started outside gevent, runs an asyncio event loop
  (on an epoll selector of its own, not gevent's) with a ``grpc.aio`` server; grpcio's own
  polling thread is a real OS thread too
  (:func:`~doq_lib.grpc_loop._grpc_uses_os_threads`);
* every call is handed to the **hub** (the event loop thread, where the service, Raft and
  the HTTP API live) through one thread-safe hand-off, :class:`~doq_lib.grpc_loop.HubBridge`
  (``loop.run_callback_threadsafe``); the hub runs :class:`~doq_lib.grpc_api.DoqServicer`'s
  handler in a greenlet, exactly as in gevent mode, with a :class:`HubContext` in place of
  grpc's context; results and streamed responses come back through the asyncio loop's
  ``call_soon_threadsafe``.

What each thread may touch: the gRPC thread touches only asyncio objects, grpc.aio objects
and the bridge's hand-off; the hub touches the service, gevent objects and the
:class:`HubContext`, and reaches the gRPC thread only through ``call_soon_threadsafe``. No
gevent primitive is used off the hub, and no asyncio object off the gRPC thread.

Streams: the gRPC thread reads a stream's requests into a hand-off that holds at most
``READ_AHEAD`` requests the handler's iterator has not taken (beyond that it stops reading, so
HTTP/2 flow control slows the client down; the handlers' own read-ahead in ``grpc_api`` is
bounded per stream and per node); the handler's responses are written in order. A client's
half-close ends the handler's request iterator; a cancelled call ends ``is_active()`` and runs
the handler's ``add_callback`` callbacks in the hub.

The threads' plumbing (real OS threads, the gRPC thread's selector, the hand-off) is in
:mod:`doq_lib.grpc_loop`; this module holds the hub's side of a call (:class:`HubContext`),
the asyncio side of every RPC and :class:`ThreadServer`.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Callable, Iterable, Iterator

import gevent
import gevent.event
import grpc

from doq_lib.grpc_api import (
    MAX_MESSAGE_BYTES,
    MAX_REQUEST_BYTES,
    STREAMING_RPCS,
    DoqServicer,
    GrpcAuth,
)
from doq_lib.grpc_loop import HubBridge, OsThread, _Epoll, _grpc_uses_os_threads
from doq_lib.grpc_requests import Malformed, tolerant_parser
from doq_lib.metrics import Metrics
from doq_lib.pb import doq_pb2 as pb

log = logging.getLogger(__name__)

REFUSED = "refused"             # a call _admit refused (and counted)
READ_AHEAD = 64                 # requests of one stream read but not yet taken by its handler


# -- the handler's context in the hub ------------------------------------------------------------
class Aborted(Exception):
    """Raised by :meth:`HubContext.abort` (grpc's own ``abort`` raises an Exception too)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class HubContext:
    """What :class:`DoqServicer` uses of ``grpc.ServicerContext``, for a call served from
    the gRPC thread. Lives in the hub; the gRPC thread reads ``trailers`` once the handler
    has ended and calls :meth:`end` (through the bridge) when the call is over."""

    def __init__(self, metadata: tuple[tuple[str, Any], ...]) -> None:
        self._metadata = metadata
        self.trailers: tuple[tuple[str, Any], ...] = ()
        self._active = True
        self._callbacks: list[Callable[[], None]] = []
        self._code: grpc.StatusCode | None = None

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata

    def set_trailing_metadata(self, metadata: Iterable[tuple[str, Any]]) -> None:
        self.trailers = tuple(metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self._code = code
        raise Aborted(code, details)

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def is_active(self) -> bool:
        return self._active

    def add_callback(self, callback: Callable[[], None]) -> bool:
        if not self._active:
            return False
        self._callbacks.append(callback)
        return True

    def end(self) -> None:
        """(hub) The call is over: it is no longer active; run the callbacks."""
        if not self._active:
            return
        self._active = False
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - one bad callback must not stop the others
                log.exception("gRPC call callback failed")


_END = object()


class _Requests:
    """A stream's requests on their way from the gRPC thread to the handler in the hub."""

    def __init__(self, loop: asyncio.AbstractEventLoop, credit: asyncio.Semaphore) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._loop, self._credit = loop, credit
        self._ready: gevent.event.Event | None = None      # created and used in the hub

    def push(self, item: Any) -> None:
        """(gRPC thread) Append; the hub is woken by :meth:`wake` (posted)."""
        self._items.append(item)

    def wake(self) -> None:
        if self._ready is not None:
            self._ready.set()

    def __iter__(self) -> Iterator[Any]:
        """(hub) The handler's request iterator: ends at the client's half-close."""
        self._ready = gevent.event.Event()
        while True:
            while not self._items:
                self._ready.clear()
                if not self._items:
                    self._ready.wait()
            item = self._items.popleft()
            if item is _END:
                self._items.appendleft(_END)          # every later read ends too
                return
            try:
                self._loop.call_soon_threadsafe(self._credit.release)
            except RuntimeError:
                pass
            yield item


class _Served:
    """The asyncio side of every RPC of ``queue.DOQ``: auth, metrics, hand-off."""

    def __init__(self, servicer: DoqServicer, auth: GrpcAuth, metrics: Metrics | None,
                 bridge: HubBridge) -> None:
        self.servicer, self.auth, self.metrics, self.bridge = servicer, auth, metrics, bridge

    def _observe(self, method: str, code: str, started: float) -> None:
        if self.metrics is not None:
            self.bridge.post(self.metrics.observe_grpc, method, code, time.perf_counter() -
                             started)

    async def _admit(self, method: str, context: Any, started: float) -> str:
        """Refuse (abort, counted here) a call its key may not make, as the interceptor does
        in gevent mode; returns the status name to count if the call ends unexpectedly."""
        refused = self.auth.refusal(method, tuple(context.invocation_metadata() or ()))
        if refused is not None:
            status, wire_code, message = refused
            self._observe(method, status.name, started)
            await self._abort(context, status, message, (("doq-error-code", wire_code),))
        return "UNKNOWN"

    async def _settle(self, context: Any, outcome: asyncio.Future[Any],
                      hub_context: HubContext) -> Any:
        """The handler's result; its abort becomes the call's status, with its trailers."""
        try:
            result = await outcome
        except Aborted as abort:
            await self._abort(context, abort.code, abort.details, hub_context.trailers)
        if hub_context.trailers:
            context.set_trailing_metadata(hub_context.trailers)
        return result

    def _finished(self, method: str, code: str, started: float,
                  hub_context: HubContext) -> None:
        """Count the call (a refused one was counted by ``_admit``); a call the handler
        aborted counts with the status it aborted with."""
        if code == REFUSED:
            return
        if code == "UNKNOWN" and hub_context.code() is not None:
            code = hub_context.code().name       # type: ignore[union-attr]
        self._observe(method, code, started)

    @staticmethod
    async def _abort(context: Any, code: grpc.StatusCode, details: str,
                     trailers: tuple[tuple[str, Any], ...]) -> None:
        context.set_trailing_metadata(trailers)
        await context.abort(code, details, trailers)

    def unary(self, name: str) -> Callable[..., Any]:
        handler = getattr(self.servicer, name)
        method = f"/queue.DOQ/{name}"
        bridge = self.bridge

        def run(request: Any, context: HubContext) -> Any:
            try:
                return handler(request, context)
            finally:
                context.end()

        async def serve(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started, code = time.perf_counter(), REFUSED
            hub_context = HubContext(tuple(context.invocation_metadata() or ()))
            try:
                code = await self._admit(method, context, started)
                if isinstance(request, Malformed):
                    code = "INVALID_ARGUMENT"
                    await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, request.message,
                                      (("doq-error-code", "invalid_argument"),))
                response = await self._settle(
                    context, bridge.call(asyncio.get_running_loop(), run, request, hub_context),
                    hub_context)
                code = "OK"
                return response
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            finally:
                self._finished(method, code, started, hub_context)
        return serve

    def stream(self, name: str) -> Callable[..., Any]:
        handler = getattr(self.servicer, name)
        method = f"/queue.DOQ/{name}"
        bridge = self.bridge

        def run(requests: _Requests, context: HubContext,
                emit: Callable[[Any], None]) -> None:
            try:
                for response in handler(iter(requests), context):
                    emit(response)
            finally:
                emit(_END)                    # after every answer: the handler has ended
                context.end()

        async def serve(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            started, code = time.perf_counter(), REFUSED
            loop = asyncio.get_running_loop()
            out: asyncio.Queue[Any] = asyncio.Queue()
            credit = asyncio.Semaphore(READ_AHEAD)
            requests = _Requests(loop, credit)
            hub_context = HubContext(tuple(context.invocation_metadata() or ()))

            malformed: list[Malformed] = []

            async def read() -> None:
                try:
                    async for request in request_iterator:
                        if isinstance(request, Malformed):   # ends the stream here
                            malformed.append(request)
                            break
                        await credit.acquire()
                        requests.push(request)
                        bridge.post(requests.wake)
                except Exception:  # noqa: BLE001 - a broken or cancelled stream has ended
                    pass
                finally:
                    requests.push(_END)
                    bridge.post(requests.wake)

            def emit(response: Any) -> None:              # hub
                try:
                    loop.call_soon_threadsafe(out.put_nowait, response)
                except RuntimeError:           # the gRPC thread's loop is closed: shut down
                    pass

            reader: asyncio.Task[None] | None = None
            done: asyncio.Future[Any] | None = None
            try:
                code = await self._admit(method, context, started)
                reader = loop.create_task(read())
                done = bridge.call(loop, run, requests, hub_context, emit)
                while (response := await out.get()) is not _END:
                    yield response
                await self._settle(context, done, hub_context)
                if malformed:                    # what came before it was answered
                    code = "INVALID_ARGUMENT"
                    await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                                      malformed[0].message,
                                      (("doq-error-code", "invalid_argument"),))
                code = "OK"
            except (asyncio.CancelledError, GeneratorExit):
                code = "CANCELLED"
                raise
            finally:
                if reader is not None:
                    reader.cancel()
                requests.push(_END)
                bridge.post(requests.wake)
                bridge.post(hub_context.end)
                self._finished(method, code, started, hub_context)
        return serve


def _handlers(served: _Served) -> grpc.GenericRpcHandler:
    """Every RPC of ``queue.DOQ``, with requests parsed by ``grpc_api.tolerant_parser``."""
    methods = {}
    for method in pb.DESCRIPTOR.services_by_name["DOQ"].methods:
        parse = tolerant_parser(getattr(pb, method.input_type.name))
        serialize = getattr(pb, method.output_type.name).SerializeToString
        if method.name in STREAMING_RPCS:
            methods[method.name] = grpc.stream_stream_rpc_method_handler(
                served.stream(method.name), request_deserializer=parse,
                response_serializer=serialize)
        else:
            methods[method.name] = grpc.unary_unary_rpc_method_handler(
                served.unary(method.name), request_deserializer=parse,
                response_serializer=serialize)
    return grpc.method_handlers_generic_handler("queue.DOQ", methods)


class _Stopped:
    """What ``ThreadServer.stop`` returns: ``wait(timeout)`` in the hub."""

    def __init__(self, event: gevent.event.Event) -> None:
        self._event = event

    def wait(self, timeout: float | None = None) -> bool:
        return bool(self._event.wait(timeout))


class ThreadServer:
    """A ``grpc.aio`` server for ``service`` on its own OS thread (see the module notes).

    Created in the hub; :meth:`start` starts the thread and returns once the port is bound
    (raises OSError if it cannot be); :meth:`stop` ends it like ``grpc.Server.stop``.
    """

    def __init__(self, servicer: DoqServicer, auth: GrpcAuth, address: str,
                 metrics: Metrics | None = None, credentials: Any = None,
                 max_concurrent: int = 8192) -> None:
        self._served = _Served(servicer, auth, metrics, HubBridge())
        self._address, self._credentials = address, credentials
        self._max_concurrent = max_concurrent
        self._hub_loop = gevent.get_hub().loop
        self._bound = gevent.event.Event()
        self._stopped = gevent.event.Event()
        self.port = 0
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Any = None
        self._thread: OsThread | None = None

    def bind(self) -> int:
        """Start the gRPC thread and bind; returns the bound port."""
        _grpc_uses_os_threads()
        # A log record names its thread: in a thread gevent does not know, that would make
        # gevent's threading invent a dummy thread object with gevent primitives.
        logging.logThreads = False
        self._thread = OsThread(target=self._main, name="doq-grpc", daemon=True)
        self._thread.start()
        self._bound.wait()
        if self._error is not None:
            raise OSError(f"cannot serve gRPC on {self._address}: {self._error}")
        return self.port

    def _tell_hub(self, event: gevent.event.Event) -> None:
        self._hub_loop.run_callback_threadsafe(event.set)

    def _main(self) -> None:
        loop = asyncio.SelectorEventLoop(_Epoll())
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the hub
            if self._error is None:
                self._error = exc
            log.exception("the gRPC thread failed")
        finally:
            try:
                self._finish(loop)
            finally:
                self._tell_hub(self._bound)
                self._tell_hub(self._stopped)

    @staticmethod
    def _finish(loop: asyncio.AbstractEventLoop) -> None:
        """End what is left on the gRPC thread's loop (as ``asyncio.run`` does), then close it."""
        try:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        except Exception:  # noqa: BLE001 - shutting down anyway
            log.exception("ending the gRPC thread's tasks failed")
        finally:
            loop.close()

    async def _serve(self) -> None:
        options = [("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.so_reuseport", 0),
               # Fixed flow-control windows (no BDP probing, which grows them to megabytes
               # per stream): what a client sends ahead of the node's reading is bounded.
               ("grpc.http2.bdp_probe", 0)]
        server = grpc.aio.server(options=options,
                                 maximum_concurrent_rpcs=self._max_concurrent)
        server.add_generic_rpc_handlers((_handlers(self._served),))
        try:
            port = server.add_secure_port(self._address, self._credentials) \
                if self._credentials is not None else server.add_insecure_port(self._address)
        except RuntimeError as exc:
            port, self._error = 0, exc
        if port == 0:
            self._error = self._error or OSError("the address is taken or invalid")
            return
        self.port = port
        self._server = server
        self._stop_requested = asyncio.Event()
        await server.start()
        self._tell_hub(self._bound)
        await self._stop_requested.wait()

    def start(self) -> None:
        """Serving began at :meth:`bind` (grpc.Server's start, for the node's life cycle)."""

    def stop(self, grace: float | None = None) -> _Stopped:
        """Stop accepting calls; after ``grace`` seconds cancel those still running."""
        loop, server = self._loop, self._server
        if loop is None or server is None or self._stopped.is_set():
            self._stopped.set()
            return _Stopped(self._stopped)

        async def shut() -> None:
            try:
                await server.stop(grace)
            finally:
                self._stop_requested.set()
        try:
            loop.call_soon_threadsafe(lambda: loop.create_task(shut()))
        except RuntimeError:                      # the loop is already closed
            self._stopped.set()
        return _Stopped(self._stopped)


def build_thread_server(service: Any, address: str, metrics: Metrics | None = None,
                        keys: Any = None, credentials: Any = None,
                        max_workers: int = 8192) -> tuple[ThreadServer, int]:
    """Like :func:`doq_lib.grpc_server.build_server`, served from the gRPC thread."""
    auth = GrpcAuth(keys)
    server = ThreadServer(DoqServicer(service, auth), auth, address, metrics, credentials,
                          max_workers)
    return server, server.bind()
