"""The asyncio client: the same calls as :mod:`doq_lib.client`, as coroutines.

    from doq_lib.client.aio import connect_async

    async with await connect_async(["http://127.0.0.1:8000", "http://127.0.0.1:8001"]) as client:
        await client.enqueue("emails", '{"to": 1}')
        async with client.consume("emails") as consumer:
            async for message in consumer:
                print(message.json())
                await message.ack()

HTTP goes through aiohttp (one session, its connection pool shared by every coroutine of
the client), gRPC through ``grpc.aio`` (one channel per node). Every unary call is the same
call as the blocking client's (:mod:`doq_lib.client.calls`): the same arguments, checks,
results, errors and failover rules. Unlike a blocking client, one asyncio client is meant to
be shared: any number of coroutines may call it at once (``asyncio.gather``). A client
belongs to the event loop that first used it. Backups and restores, producers and
``enqueue_stream`` are only in the blocking client.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable, Sequence, TypeVar, cast

import aiohttp
import yarl

from doq_lib.client import http_calls, rpc_calls
from doq_lib.client.aio_consumers import AsyncGrpcConsumer, AsyncHttpConsumer
from doq_lib.client.calls import HttpCall, RpcCall, awaiting
from doq_lib.client.common import (
    DEFAULT_RETRY,
    HTTP_MAX_BATCH,
    HTTP_MAX_WAIT,
    NO_SECURITY,
    RETRY_PAUSE,
    Failover,
    RetryPolicy,
    Security,
    Unreachable,
    default_consumer,
    grpc_targets,
    nodes_of,
    schemes_of,
)
from doq_lib.client.delivered import AsyncDelivered, AsyncSettler
from doq_lib.client.http_calls import result_of
from doq_lib.client.rpc_calls import error_of, message_of
from doq_lib.client.subscriptions import PREFETCH
from doq_lib.errors import DoqError, InvalidArgument, PermissionDenied, Unauthenticated, Unavailable
from doq_lib.models import Message

T = TypeVar("T")
C = TypeVar("C", bound="AsyncClientBase")

__all__ = ["AsyncClient", "AsyncGrpcClient", "AsyncHttpClient", "connect_async"]


class AsyncClientBase:
    """What both asyncio clients share: the node list, failover and closing."""

    _failover: Failover
    consumer: str = ""

    @property
    def node(self) -> str:
        """The node (host:port) calls go to first."""
        return self._failover.node

    @property
    def nodes(self) -> list[str]:
        return list(self._failover.nodes)

    def delivered(self, message: Message, queue: str) -> AsyncDelivered:
        """A message this client took without acking it, settled through this client
        (``await message.ack()``, ``.nack()``, ``.touch()``, ``.reject()``)."""
        return AsyncDelivered.of(message, queue, cast(AsyncSettler, self))

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self: C) -> C:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()

    async def _over_nodes(self, attempt: Callable[[str], Awaitable[T]]) -> T:
        """Run ``attempt(node)``, moving over the nodes while it surely did not apply (as
        the blocking clients' failover, without its lock: calls run side by side)."""
        last: DoqError | None = None
        for node in self._failover.walk():
            if node is None:
                await asyncio.sleep(RETRY_PAUSE)
                await self._refresh()
                continue
            try:
                return await attempt(node)
            except Unavailable as exc:
                if exc.maybe_applied:
                    raise
                last = exc
        raise last or Unavailable("no node answered")

    async def _refresh(self) -> None:
        """Find the cluster's nodes again after a round in which none took a call."""


class AsyncHttpClient(AsyncClientBase):
    """The REST API through aiohttp; the calls of :mod:`doq_lib.client.http_calls`."""

    transport = "http"

    def __init__(self, urls: Sequence[str], timeout: float = 10.0,
                 retry: RetryPolicy = DEFAULT_RETRY, security: Security = NO_SECURITY,
                 consumer: str | None = None) -> None:
        """No I/O here: :func:`connect_async` also finds the leader."""
        nodes, secure = nodes_of(urls, "https")
        self.consumer = default_consumer() if consumer is None else consumer
        self.timeout = timeout
        self.security = security
        self.scheme = "https" if secure else "http"
        self._tls = security.ssl_context() if secure else None
        self._failover = Failover(nodes, retry)
        self._session: aiohttp.ClientSession | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self.security.headers(),
                connector=aiohttp.TCPConnector(ssl=self._tls if self._tls else True))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _send(self, node: str, method: str, path: str, body: Any, safe: bool = True,
                    extra_time: float = 0.0) -> tuple[int, bytes]:
        """One request to ``node``: the status and the whole answer."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else None
        url = yarl.URL(f"{self.scheme}://{node}{path}", encoded=True)   # paths come quoted
        try:
            async with self._session_now().request(
                    method, url, data=data, headers=headers,
                    timeout=aiohttp.ClientTimeout(total=self.timeout + extra_time)) as answer:
                return answer.status, await answer.read()
        except aiohttp.ClientConnectorError as exc:          # not connected: surely not sent
            raise Unreachable(f"{node}: {exc}") from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise Unavailable(f"{node}: {exc!r}", maybe_applied=not safe) from None

    async def perform(self, call: HttpCall) -> Any:
        """Send ``call`` to the first node that takes it (failover); its decoded answer."""
        async def attempt(node: str) -> Any:
            status, raw = await self._send(node, call.method, call.path, call.body, call.safe,
                                           call.extra_time)
            return result_of(status, raw)
        return await self._over_nodes(attempt)

    async def find_leader(self) -> str | None:
        """Ask the cluster which node leads and send requests there first."""
        try:
            servers = await self.servers()
        except (Unauthenticated, PermissionDenied):
            raise
        except DoqError:
            return None
        return self._failover.prefer_leader(servers)

    async def ready(self, node: str | None = None) -> bool:
        """Whether ``node`` (default: the current one) answers /readyz with 200."""
        try:
            status, _ = await self._send(node or self.node, "GET", "/readyz", None)
        except Unavailable:
            return False
        return status == 200

    def consume(self, queue: str, ack: bool = False, prefetch: int = PREFETCH,
                wait: float = 5.0) -> AsyncHttpConsumer:
        """Consume ``queue`` in batches of up to ``prefetch``; see :class:`AsyncHttpConsumer`."""
        return AsyncHttpConsumer(self, queue, ack, prefetch, wait)

    servers = awaiting(http_calls.servers)
    generate_ids = awaiting(http_calls.generate_ids)
    # queues
    create_queue = awaiting(http_calls.create_queue)
    update_queue = awaiting(http_calls.update_queue)
    delete_queue = awaiting(http_calls.delete_queue)
    queues = awaiting(http_calls.queues)
    queue = awaiting(http_calls.queue)
    # messages
    enqueue = awaiting(http_calls.enqueue)
    enqueue_batch = awaiting(http_calls.enqueue_batch)
    dequeue = awaiting(http_calls.dequeue)
    dequeue_many = awaiting(http_calls.dequeue_many)
    consumers = awaiting(http_calls.consumers)
    get = awaiting(http_calls.get)
    delete = awaiting(http_calls.delete)
    ack = awaiting(http_calls.ack)
    ack_batch = awaiting(http_calls.ack_batch)
    ack_many = awaiting(http_calls.ack_many)
    nack = awaiting(http_calls.nack)
    nack_many = awaiting(http_calls.nack_many)
    reject = awaiting(http_calls.reject)
    touch = awaiting(http_calls.touch)
    update_priority = awaiting(http_calls.update_priority)
    # operator controls
    purge = awaiting(http_calls.purge)
    pause = awaiting(http_calls.pause)
    resume = awaiting(http_calls.resume)
    pause_group = awaiting(http_calls.pause_group)
    resume_group = awaiting(http_calls.resume_group)
    groups = awaiting(http_calls.groups)
    browse = awaiting(http_calls.browse)
    explain = awaiting(http_calls.explain)
    redrive = awaiting(http_calls.redrive)
    # schedules
    put_schedule = awaiting(http_calls.put_schedule)
    schedules = awaiting(http_calls.schedules)
    schedule = awaiting(http_calls.schedule)
    delete_schedule = awaiting(http_calls.delete_schedule)
    pause_schedule = awaiting(http_calls.pause_schedule)
    resume_schedule = awaiting(http_calls.resume_schedule)


class AsyncGrpcClient(AsyncClientBase):
    """The ``queue.DOQ`` gRPC service through ``grpc.aio``; the calls of
    :mod:`doq_lib.client.rpc_calls`."""

    transport = "grpc"

    def __init__(self, targets: Sequence[str], timeout: float = 10.0,
                 retry: RetryPolicy = DEFAULT_RETRY, leader: str | None = None,
                 discovery: Sequence[str] = (), security: Security = NO_SECURITY,
                 consumer: str | None = None) -> None:
        """As :class:`~doq_lib.client.GrpcClient`'s."""
        import grpc
        import grpc.aio

        from doq_lib.pb import doq_pb2, doq_pb2_grpc
        self.consumer = default_consumer() if consumer is None else consumer
        self._grpc = grpc
        self._pb = doq_pb2
        self._stub_class: Any = doq_pb2_grpc.DOQStub
        nodes, secure = nodes_of(targets, "grpcs")
        self.timeout = timeout
        self.security = security
        self.metadata = security.metadata()
        self._credentials = security.grpc_credentials() if secure else None
        self._discovery = list(discovery)
        self._failover = Failover(nodes, retry)
        if leader:
            self._failover.prefer(leader)
        self._channels: dict[str, Any] = {}
        self._stubs: dict[str, Any] = {}

    @property
    def pb(self) -> Any:
        """The generated message classes (doq_pb2)."""
        return self._pb

    @property
    def rpc_error(self) -> type[Exception]:
        """The exception class a failed call raises (grpc.RpcError)."""
        return self._grpc.RpcError  # type: ignore[no-any-return]

    def stub(self, node: str | None = None) -> Any:
        node = node or self.node
        stub = self._stubs.get(node)
        if stub is None:
            aio = self._grpc.aio
            channel = aio.insecure_channel(node) if self._credentials is None else \
                aio.secure_channel(node, self._credentials)
            self._channels[node] = channel
            stub = self._stubs[node] = self._stub_class(channel)
        return stub

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        for channel in channels:
            await channel.close()

    async def perform(self, call: RpcCall) -> Any:
        """Make ``call`` on the first node that takes it (failover); its response."""
        async def attempt(node: str) -> Any:
            try:
                return await getattr(self.stub(node), call.rpc)(
                    call.request, timeout=self.timeout, metadata=self.metadata)
            except self._grpc.RpcError as exc:
                raise error_of(exc, call.safe) from None
        return await self._over_nodes(attempt)

    async def _refresh(self) -> None:
        if not self._discovery:
            return
        try:
            async with AsyncHttpClient(self._discovery, self.timeout, ONE_QUICK_ROUND,
                                       self.security) as http:
                self._failover.add([s.grpc_addr for s in await http.servers() if s.grpc_addr])
        except DoqError:
            return

    async def dequeue_many(self, queue: str, count: int, ack: bool = False,
                           wait: float = 0.0) -> list[Message]:
        """As :meth:`~doq_lib.client.GrpcClient.dequeue_many`: a short DequeueStream with
        ``count`` credit, half-closed once the first messages arrive or ``wait`` is over."""
        if not 1 <= count <= HTTP_MAX_BATCH or not 0 <= wait <= HTTP_MAX_WAIT:
            raise InvalidArgument(f"count must be from 1 to {HTTP_MAX_BATCH}, wait from 0 "
                                  f"to {HTTP_MAX_WAIT:g} s")

        async def attempt(node: str) -> list[Message]:
            return await self._take(node, queue, count, ack, wait)
        # A node that cannot be reached took nothing: the take moves to the next one.
        taken = await self._over_nodes(attempt)
        return taken if ack else [self.delivered(m, queue) for m in taken]

    async def _take(self, node: str, queue: str, count: int, ack: bool,
                    wait: float) -> list[Message]:
        """:meth:`dequeue_many` on ``node``."""
        call = self.stub(node).DequeueStream(metadata=self.metadata,
                                             timeout=self.timeout + wait)
        out: list[Message] = []
        writing = True

        async def half_close() -> None:
            nonlocal writing
            if writing:
                writing = False
                await call.done_writing()
        try:
            await call.write(self._pb.DequeueRequest(queueName=queue, ack=ack, credit=count,
                                                     consumer=self.consumer,
                                                     max_batch=min(count, 256)))
            if wait <= 0:
                await half_close()
            first = asyncio.ensure_future(call.read())
            done, _ = await asyncio.wait({first}, timeout=wait if wait > 0 else None)
            if not done:
                await half_close()          # the wait is over: take what the server has
            response = await first
            while response is not self._grpc.aio.EOF:
                out.extend(message_of(m) for m in response.messages or [response])
                await half_close()
                response = await call.read()
        except self._grpc.RpcError as exc:
            if not out:
                raise error_of(exc) from None
        return out

    def consume(self, queue: str, ack: bool = False,
                prefetch: int = PREFETCH) -> AsyncGrpcConsumer:
        """Subscribe to ``queue`` with a DequeueStream; see :class:`AsyncGrpcConsumer`."""
        return AsyncGrpcConsumer(self, queue, ack, prefetch)

    generate_ids = awaiting(rpc_calls.generate_ids)
    # queues
    create_queue = awaiting(rpc_calls.create_queue)
    update_queue = awaiting(rpc_calls.update_queue)
    delete_queue = awaiting(rpc_calls.delete_queue)
    queues = awaiting(rpc_calls.queues)
    queue = awaiting(rpc_calls.queue)
    # messages
    enqueue = awaiting(rpc_calls.enqueue)
    enqueue_batch = awaiting(rpc_calls.enqueue_batch)
    dequeue = awaiting(rpc_calls.dequeue)
    consumers = awaiting(rpc_calls.consumers)
    get = awaiting(rpc_calls.get)
    delete = awaiting(rpc_calls.delete)
    ack = awaiting(rpc_calls.ack)
    ack_batch = awaiting(rpc_calls.ack_batch)
    ack_many = awaiting(rpc_calls.ack_many)
    nack = awaiting(rpc_calls.nack)
    nack_many = awaiting(rpc_calls.nack_many)
    reject = awaiting(rpc_calls.reject)
    touch = awaiting(rpc_calls.touch)
    update_priority = awaiting(rpc_calls.update_priority)
    # operator controls
    purge = awaiting(rpc_calls.purge)
    pause = awaiting(rpc_calls.pause)
    resume = awaiting(rpc_calls.resume)
    pause_group = awaiting(rpc_calls.pause_group)
    resume_group = awaiting(rpc_calls.resume_group)
    groups = awaiting(rpc_calls.groups)
    browse = awaiting(rpc_calls.browse)
    explain = awaiting(rpc_calls.explain)
    redrive = awaiting(rpc_calls.redrive)
    # schedules
    put_schedule = awaiting(rpc_calls.put_schedule)
    schedules = awaiting(rpc_calls.schedules)
    schedule = awaiting(rpc_calls.schedule)
    delete_schedule = awaiting(rpc_calls.delete_schedule)
    pause_schedule = awaiting(rpc_calls.pause_schedule)
    resume_schedule = awaiting(rpc_calls.resume_schedule)


AsyncClient = AsyncHttpClient | AsyncGrpcClient
ONE_QUICK_ROUND = RetryPolicy(attempts=1, deadline=5)


async def connect_async(urls: str | Sequence[str], transport: str | None = None,
                        timeout: float = 10.0, retry: RetryPolicy = DEFAULT_RETRY,
                        api_key: str | None = None, ca_file: str | None = None,
                        cert_file: str | None = None, key_file: str | None = None,
                        consumer: str | None = None) -> AsyncClient:
    """An asyncio client for the nodes at ``urls``: the arguments of
    :func:`doq_lib.client.connect`. Close it (``await client.close()``, or ``async with``)."""
    nodes = [urls] if isinstance(urls, str) else list(urls)
    security = Security(api_key, ca_file, cert_file, key_file)
    scheme, plain = schemes_of(nodes)
    transport = transport or plain
    if transport == "http" and plain == "http":
        client = AsyncHttpClient(nodes, timeout, retry, security, consumer)
        try:
            await client.find_leader()
        except BaseException:
            await client.close()
            raise
        return client
    if transport == "grpc" and plain == "grpc":
        return AsyncGrpcClient(nodes, timeout, retry, security=security, consumer=consumer)
    if transport == "grpc" and plain == "http":
        async with AsyncHttpClient(nodes, timeout, retry, security) as http:
            servers = await http.servers()
            for _ in range(20):               # members publish their addresses shortly
                if all(s.grpc_addr for s in servers):
                    break
                await asyncio.sleep(0.1)
                servers = await http.servers()
        # the listed names are resolved off the event loop
        targets, leader = await asyncio.to_thread(grpc_targets, servers, scheme)
        return AsyncGrpcClient(targets, timeout, retry, leader=leader, discovery=nodes,
                               security=security, consumer=consumer)
    raise InvalidArgument(f"unknown transport {transport!r}: use http or grpc")
