"""What the HTTP and gRPC clients share: credentials, the retry policy, the node list with
its failover loop, batch results, and the settings and strategy conversions."""
from __future__ import annotations

import os
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, TypeVar, cast

from doq_lib.client.delivered import Delivered, Settler
from doq_lib.errors import DoqError, InvalidArgument, Unavailable
from doq_lib.models import LIFECYCLE_SETTINGS, Message, QueueSettings, QueueType, Strategy

T = TypeVar("T")
HTTP_MAX_BATCH = 1000        # ids or messages one HTTP request takes at most
HTTP_MAX_WAIT = 20.0         # seconds an HTTP long-poll waits at most
RETRY_PAUSE = 0.2           # seconds between rounds over all nodes


class Unreachable(Unavailable):
    """No answer at all: the connection to the node could not be made (refused, no such
    host, TLS failed). Nothing was sent."""


@dataclass(frozen=True)
class Created:
    """What ``create_queue`` did. ``existed``: a queue of that name was there already and
    nothing changed; ``type`` and ``settings`` are then its stored definition (over HTTP and
    gRPC alike), else the ones asked for."""

    name: str
    type: QueueType
    settings: QueueSettings
    existed: bool = False


@dataclass(frozen=True)
class Failure:
    """One id of a batch ack / nack that was not settled (its state is unchanged)."""

    id: int
    code: str                   # message_not_unacked, message_not_found
    detail: str


@dataclass(frozen=True)
class Settled:
    """What a batch ack / nack (or a redrive) did: the ids settled, and why each of the
    others was not; ``count``: how many were settled (a redrive by count names no ids)."""

    done: list[int]
    failed: list[Failure]
    count: int = -1
    enqueued: dict[int, list[int]] = field(default_factory=dict)   # id -> ids its ack stored

    def __post_init__(self) -> None:
        if self.count < 0:
            object.__setattr__(self, "count", len(self.done))


@dataclass(frozen=True)
class Nacked:
    """What a nack did: true (as the bool earlier versions answered) when the message was
    dead-lettered instead, its deliveries used up; ``ids``: the messages stored with it."""

    dead_lettered: bool
    ids: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.dead_lettered


@dataclass(frozen=True)
class Browsed:
    """A message listed by a browse: its state (ready, unacked) and, delivered, its ack
    deadline (unix ms)."""

    message: Message
    state: str
    deadline: int = 0
    consumer: str = ""            # delivered: who holds it ("": unnamed)
    delivered_at: int = 0         # delivered: when (unix ms)


@dataclass(frozen=True)
class Explanation:
    """Why a message is (not) being delivered: ready, unacked or blocked, the reasons
    ({"code": ..., ...}) and how many deliverable messages come before it; delivered, who
    holds it since when."""

    state: str
    reasons: list[dict[str, Any]]
    ahead: int
    held_by: str = ""
    held_since: int = 0


@dataclass(frozen=True)
class ConsumerInfo:
    """A consumer a queue knows: the messages it holds (the first 100 ids of ``held``,
    oldest delivery first), the age of its oldest delivery, when it was last seen (unix ms)
    and its deliveries, acks and nacks."""

    name: str
    held: int
    messages: list[int]
    oldest_lease_ms: int
    last_seen: int
    deliveries: int
    acks: int
    nacks: int


def default_consumer() -> str:
    """The name a client gives its consumers unless told another: host:pid:program."""
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    name = f"{socket.gethostname()}:{os.getpid()}:{program or 'python'}"
    name = "".join(c for c in name if c.isprintable())
    return name.encode()[:200].decode(errors="ignore")


@dataclass(frozen=True)
class RetryPolicy:
    """How long one call keeps moving over the nodes while they cannot take it."""

    attempts: int = 1000        # rounds over the known nodes, at most
    deadline: float = 15.0      # seconds, for one call including its retries


DEFAULT_RETRY = RetryPolicy()


@dataclass(frozen=True)
class Security:
    """Credentials of a client: an API key (sent as ``Authorization: Bearer``), and for
    https:// and grpcs:// the CA that signs the servers' certificates (None: the system's)
    and, for mutual TLS, a client certificate and its key."""

    api_key: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def grpc_credentials(self) -> Any:
        import grpc

        def read(path: str | None) -> bytes | None:
            if not path:
                return None
            with open(path, "rb") as f:
                return f.read()
        return grpc.ssl_channel_credentials(read(self.ca_file), read(self.key_file),
                                            read(self.cert_file))


NO_SECURITY = Security()


def parse_url(url: str, default_scheme: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a node address; one without a scheme is taken as
    ``default_scheme://``."""
    given = url
    if "://" not in url:
        url = f"{default_scheme}://{url}"
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or not port:
        raise InvalidArgument(f"bad node address {given!r}: expected {default_scheme}://host:port "
                              "(or host:port)")
    return parts.scheme, parts.hostname, port


def schemes_of(nodes: Sequence[str]) -> tuple[str, str]:
    """The one scheme of ``nodes`` (http, https, grpc, grpcs) and its plain form."""
    schemes = {parse_url(u, "http")[0] for u in nodes}
    if len(schemes) != 1:
        raise InvalidArgument("give addresses of one scheme: all http(s):// or all grpc(s)://")
    scheme = schemes.pop()
    return scheme, {"https": "http", "grpcs": "grpc"}.get(scheme, scheme)


def grpc_targets(servers: Sequence[Any], scheme: str) -> tuple[list[str], str | None]:
    """The members' gRPC URLs (grpcs:// when ``scheme`` is https) and the leader's address,
    from the cluster's listing; those whose host does not resolve here come last (a name only
    the nodes know, as a container's, or a pod's not yet in DNS), and when none resolves the
    error says what to do. Resolves names: may block on DNS."""
    prefix = "grpcs://" if scheme == "https" else "grpc://"
    listed = [s.grpc_addr for s in servers if s.grpc_addr]
    if not listed:
        raise Unavailable("the cluster serves no gRPC (grpc.address is empty)")
    usable = [addr for addr in listed if _resolves(addr)]
    if not usable:
        raise Unavailable(
            f"the cluster lists its gRPC addresses as {', '.join(listed)}, and none of those "
            "names resolves here: connect with the nodes' grpc:// URLs (e.g. the published "
            "ports), or have the nodes advertise reachable ones (grpc.advertise)")
    leader = next((s.grpc_addr for s in servers if s.is_leader and s.grpc_addr in usable), None)
    ordered = usable + [addr for addr in listed if addr not in usable]
    return [prefix + addr for addr in ordered], leader


def _resolves(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        socket.getaddrinfo(host or "127.0.0.1", int(port) if port.isdigit() else None,
                           type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    return True


def nodes_of(urls: Sequence[str], secure: str) -> tuple[list[str], bool]:
    """The host:port of each URL and whether they use ``secure`` (https, grpcs), refusing
    other schemes and a mix of plain and secure addresses."""
    plain = secure[:-1]
    nodes, schemes = [], set()
    for url in urls:
        scheme, host, port = parse_url(url, plain)
        if scheme not in (plain, secure):
            article = "an" if plain == "http" else "a"
            raise InvalidArgument(f"not {article} {plain}:// or {secure}:// address: {url!r}")
        schemes.add(scheme)
        nodes.append(f"{host}:{port}")
    if len(schemes) > 1:
        raise InvalidArgument(f"give addresses of one scheme: all {plain}:// or all "
                              f"{secure}://")
    return nodes, schemes == {secure}


def lifecycle_given(lifecycle: dict[str, Any]) -> dict[str, Any]:
    """The lifecycle settings (max_deliveries, dead_letter_queue, max_messages, overflow)
    passed as keyword arguments, without those left None (an update keeps their values)."""
    unknown = set(lifecycle) - set(LIFECYCLE_SETTINGS)
    if unknown:
        raise InvalidArgument(f"unknown queue settings: {', '.join(sorted(unknown))}")
    return {k: v for k, v in lifecycle.items() if v is not None}


def settings_json(strategy: Strategy | str | None, max_unacked: int, ack_timeout: int,
                  lifecycle: dict[str, Any] | None = None) -> dict[str, Any]:
    """Queue settings as the REST API takes them, with the lifecycle settings given."""
    out: dict[str, Any] = lifecycle_given(lifecycle or {})
    if strategy:
        name = strategy.name if isinstance(strategy, Strategy) else str(strategy).upper()
        if name != "STRATEGY_UNSPECIFIED":
            out["strategy"] = name.lower()
    if max_unacked:
        out["max_unacked"] = max_unacked
    if ack_timeout:
        out["ack_timeout"] = ack_timeout
    return out


def to_strategy(value: Strategy | str | None) -> Strategy:
    if value is None or value == "":
        return Strategy.STRATEGY_UNSPECIFIED
    if isinstance(value, Strategy):
        return value
    try:
        return Strategy[str(value).upper()]
    except KeyError:
        raise InvalidArgument(f"unknown strategy {value!r}") from None


class Failover:
    """The node list, the preferred one, and the retry loop shared by both transports."""

    def __init__(self, nodes: list[str], retry: RetryPolicy,
                 refresh: Callable[[], list[str]] | None = None) -> None:
        if not nodes:
            raise InvalidArgument("no node address given")
        self.nodes = list(dict.fromkeys(nodes))
        self.current = 0
        self.retry = retry
        self.refresh = refresh          # finds the cluster's nodes again after a failed round
        self.lock = threading.RLock()

    @property
    def node(self) -> str:
        return self.nodes[self.current]

    def prefer(self, node: str) -> None:
        if node not in self.nodes:
            self.nodes.append(node)
        self.current = self.nodes.index(node)

    def prefer_leader(self, servers: Sequence[Any]) -> str | None:
        """Send to the leader first, as ``servers`` (the cluster's listing) names it; its
        HTTP address, or None when none is named."""
        for server in servers:
            if server.is_leader and server.http_addr:
                self.prefer(server.http_addr)
                return str(server.http_addr)
        return None

    def walk(self) -> Iterator[str | None]:
        """The nodes one call tries, in turn, while each surely did not apply it; None
        between rounds over all of them (pause, then :meth:`add`). Stops at the policy's
        deadline or number of rounds."""
        deadline = time.monotonic() + self.retry.deadline
        for _ in range(self.retry.attempts):
            for _ in range(len(self.nodes)):
                yield self.node
                if time.monotonic() >= deadline:
                    return
                self.current = (self.current + 1) % len(self.nodes)
            if time.monotonic() >= deadline:
                return
            yield None

    def add(self, found: Sequence[str]) -> None:
        """Nodes found since (new members)."""
        for node in found:
            if node not in self.nodes:
                self.nodes.append(node)

    def call(self, attempt: Callable[[str], T]) -> T:
        """Run ``attempt(node)``, moving over the nodes while it surely did not apply."""
        with self.lock:
            last: DoqError | None = None
            for node in self.walk():
                if node is None:
                    time.sleep(RETRY_PAUSE)
                    self._refresh()
                    continue
                try:
                    return attempt(node)
                except Unavailable as exc:
                    if exc.maybe_applied:
                        raise
                    last = exc
            raise last or Unavailable("no node answered")

    def _refresh(self) -> None:
        if self.refresh is None:
            return
        try:
            self.add(self.refresh())
        except DoqError:
            return


class Closing:
    """``close()``, also when leaving a ``with`` block."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


class ClientBase(Closing):
    """What both transports share: the node list and closing."""

    _failover: Failover
    consumer: str = ""            # the name this client's dequeues give ("": none)

    @property
    def node(self) -> str:
        """The node (host:port) calls go to first."""
        return self._failover.node

    @property
    def nodes(self) -> list[str]:
        return list(self._failover.nodes)

    def delivered(self, message: Message, queue: str) -> Delivered:
        """A message this client took without acking it, settled through this client
        (``message.ack()``, ``.nack()``, ``.touch()``, ``.reject()``)."""
        return Delivered.of(message, queue, cast(Settler, self))


class Subscription(Closing):
    """What both consumers share: iteration over :meth:`receive` and ``with`` closing."""

    def receive(self, timeout: float | None = None) -> Message | None:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        message = self.receive()
        assert message is not None
        return message

