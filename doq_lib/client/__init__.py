"""A synchronous Python client for DOQ over HTTP or gRPC (imports only layer 0).

    from doq_lib.client import connect
    client = connect(["http://127.0.0.1:8000", "http://127.0.0.1:8001"])      # REST
    client = connect("grpc://127.0.0.1:10000")                                 # gRPC
    client = connect("http://127.0.0.1:8000", transport="grpc")   # gRPC, found via HTTP

Consumers: ``client.consume(queue, prefetch=N)`` keeps up to N messages coming (over gRPC a
DequeueStream with credit; over HTTP batch takes with long-poll, ``GET ...?count=N&wait=S``).
``dequeue_many`` / ``ack_many`` / ``nack_many`` take and settle many messages in one request.
Producers: over gRPC, ``client.producer(window=N)`` pipelines enqueues on one EnqueueStream
(``send`` returns a future; at most N unanswered).

Schedules: ``client.put_schedule(queue, name, content, cron="0 3 * * *",
timezone="Europe/Berlin")`` or ``every=60`` stores a message at each occurrence (the leader
fires each once); ``schedules``, ``schedule``, ``delete_schedule``, ``pause_schedule``,
``resume_schedule``.

The asyncio client, ``await connect_async(urls)`` (:mod:`doq_lib.client.aio`), has the same
calls as coroutines. Both clients have the same methods and raise the server's own error classes
(:mod:`doq_lib.errors`: ``QueueNotFound``, ``QueueEmpty``, ``NotUnacked``, ``Unavailable`` ...).

Failover: a client knows several nodes. It talks to the leader when it can find it (fewer
hops) and moves to another node when one cannot be reached or answers ``Unavailable``. A
request is sent again only when it surely did not take effect: the connection was refused, or
the server said so (``Unavailable`` without ``maybe_applied``). A write whose outcome is
unknown raises ``Unavailable(maybe_applied=True)``; enqueue with your own ``id`` to make
retrying it safe (the same id never creates a second copy).

A client object is not meant to be shared by threads that call it at once (it serializes
them with a lock); use one per thread for parallel work.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from doq_lib.client.common import (
    DEFAULT_RETRY,
    NO_SECURITY,
    Created,
    Failure,
    RetryPolicy,
    Security,
    Settled,
    Unreachable,
    grpc_targets,
    schemes_of,
)
from doq_lib.client.delivered import Delivered
from doq_lib.client.rest import HttpClient, servers_via
from doq_lib.client.rpc import GrpcClient, Producer
from doq_lib.client.schedules import ScheduleInfo
from doq_lib.client.subscriptions import GrpcConsumer, HttpConsumer
from doq_lib.client.transport import Transport
from doq_lib.errors import InvalidArgument

if TYPE_CHECKING:
    from doq_lib.client.aio import AsyncClient, AsyncGrpcClient, AsyncHttpClient, connect_async

Consumer = GrpcConsumer          # its earlier name
ASYNC_NAMES = ("AsyncClient", "AsyncGrpcClient", "AsyncHttpClient", "connect_async")


def __getattr__(name: str) -> Any:
    """The asyncio client's names, imported when first asked for (a blocking program does
    not load aiohttp and grpc.aio)."""
    if name in ASYNC_NAMES:
        from doq_lib.client import aio
        return getattr(aio, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["NO_SECURITY", "AsyncClient", "AsyncGrpcClient", "AsyncHttpClient", "Client",
           "Created",
           "Consumer", "Delivered", "Failure", "GrpcClient", "GrpcConsumer", "HttpClient",
           "HttpConsumer", "Producer", "RetryPolicy", "ScheduleInfo", "Security", "Settled",
           "Transport", "Unreachable", "connect", "connect_async"]

Client = HttpClient | GrpcClient


def connect(urls: str | Sequence[str], transport: str | None = None, timeout: float = 10.0,
            retry: RetryPolicy = DEFAULT_RETRY, api_key: str | None = None,
            ca_file: str | None = None, cert_file: str | None = None,
            key_file: str | None = None, consumer: str | None = None) -> Client:
    """A client for the nodes at ``urls`` (``http://``, ``https://``, ``grpc://`` or
    ``grpcs://host:port``).

    ``transport="grpc"`` with http(s):// URLs finds every node's gRPC address (and the
    leader) through the HTTP API (and uses TLS for gRPC when the URLs are https://).
    ``api_key``: sent with every request; ``ca_file``: the CA of the servers' certificates
    (TLS); ``cert_file`` / ``key_file``: a client certificate for mutual TLS.
    ``consumer``: the name its dequeues give the server, which records it with each lease
    (``client.consumers(queue)``); default ``host:pid:program``, "" for none.
    """
    nodes = [urls] if isinstance(urls, str) else list(urls)
    security = Security(api_key, ca_file, cert_file, key_file)
    scheme, plain = schemes_of(nodes)
    transport = transport or plain
    if transport == plain and plain in ("http", "grpc"):
        cls: type[HttpClient] | type[GrpcClient] = HttpClient if plain == "http" else GrpcClient
        return cls(nodes, timeout, retry, security=security, consumer=consumer)
    if transport == "grpc" and plain == "http":
        targets, leader = grpc_targets(servers_via(nodes, timeout, retry, security), scheme)
        return GrpcClient(targets, timeout, retry, leader=leader, discovery=nodes,
                          security=security, consumer=consumer)
    raise InvalidArgument(f"unknown transport {transport!r}: use http or grpc")
