"""The Raft wire (L3): authenticated connections and a codec that cannot run code.

PySyncObj's own connections unpickle whatever arrives, from anyone who can reach the port, and
its optional password only encrypts what follows an unauthenticated key exchange. DOQ replaces
the connection class (:class:`SecureConnection`, also used for accepted sockets by
:class:`SecureServer`) and every place PySyncObj unpickles:

* **Handshake first.** Nothing is decoded before it completes. The connecting side sends
  ``MAGIC | flags | nonce_c``; the accepting side answers ``MAGIC | flags | nonce_s | proof_s``
  and, with a cluster secret, the connecting side proves itself with ``proof_c``. The proofs
  are HMAC-SHA256 over both nonces under the key derived from the secret, with distinct labels
  per direction (no reflection), and fresh nonces make a recorded session useless (no replay).
  A side with a secret refuses a peer without one, and the reverse.
* **Frames.** After the handshake every message is ``u32 length | body``; with a secret the
  body is AES-256-GCM under a per-direction session key (derived from both nonces) with the
  frame counter as nonce, so a frame that is changed, replayed, reordered or dropped ends the
  connection. Frames are capped at :data:`MAX_FRAME` bytes. An empty body (before
  encryption) is a keepalive: each side sends one when it has sent nothing for a third of the
  connection timeout, and a connection that heard nothing for the whole timeout is closed
  (PySyncObj itself only noticed silence when it next sent or received something).
* **Decoding.** Bodies are pickles, read by an unpickler that refuses every global: only None,
  booleans, numbers, strings, bytes, lists, tuples, dicts and sets can come out of a frame.
  Raft log commands (``pysyncobj.pickle.loads``, also used for snapshots and membership
  entries) may in addition hold PySyncObj's node objects, and nothing else.

Without a cluster secret the handshake still runs (it tells a DOQ Raft peer from anything
else) but proves nothing; a node refuses to bind Raft to a non-loopback address then
(``doq_lib.config``).

The parts: :mod:`doq_lib.raft.codec` (the restricted unpicklers, :func:`install`),
:mod:`doq_lib.raft.secure` (the handshake, keys and frames of one connection, :func:`probe`)
and this module (:class:`SecureServer` and :class:`WireTransport`, which PySyncObj uses), which
re-exports the names of the other two.
"""
from __future__ import annotations

import errno
import functools
import logging
import pickle
import socket
import time
from typing import Any

from doq_lib.raft.codec import (
    COMMAND_GLOBALS,
    PICKLE_PROTOCOL,
    UnsafePayload,
    dumps,
    install,
    loads_command,
    loads_frame,
)
from doq_lib.raft.engine import POLL_EVENT_TYPE, TransportBase, address_family, globalDnsResolver
from doq_lib.raft.secure import (
    CLUSTER,
    FLAG_SECRET,
    HELLO,
    LENGTH,
    MAGIC,
    MAX_FRAME,
    NO_CLUSTER,
    NONCE,
    PROOF,
    REPLY,
    WARN_EVERY,
    ProbeFailed,
    SecureConnection,
    WireSecurity,
    probe,
    set_outgoing_source,
)

__all__ = [
    "CLUSTER", "COMMAND_GLOBALS", "FLAG_SECRET", "NO_CLUSTER", "HELLO", "LENGTH", "MAGIC",
    "MAX_FRAME", "MESSAGE_TYPES", "NONCE", "PICKLE_PROTOCOL", "PROOF", "REPLY", "WARN_EVERY",
    "ProbeFailed",
    "SecureConnection", "SecureServer", "UnsafePayload", "WireSecurity", "WireTransport",
    "dumps", "install", "loads_command", "loads_frame", "probe", "set_outgoing_source",
]

log = logging.getLogger(__name__)

JOIN_GRACE = 10.0       # seconds an unknown member's connections are refused at INFO


# -- the listener ----------------------------------------------------------------------------
class SecureServer:
    """Drop-in for PySyncObj's ``TcpServer`` whose accepted sockets are SecureConnections."""

    def __init__(self, poller: Any, host: str, port: int, onNewConnection: Any,
                 security: WireSecurity, sendBufferSize: int = 2 ** 13,
                 recvBufferSize: int = 2 ** 13, connectionTimeout: float = 3.5,
                 keepalive: Any = None) -> None:
        self._poller = poller
        self._host, self._port = host, int(port)
        self._family = address_family(host)
        self._security = security
        self._send_size, self._recv_size = sendBufferSize, recvBufferSize
        self._timeout = connectionTimeout
        self._keepalive = keepalive
        self._on_new = onNewConnection
        self._sock: socket.socket | None = None
        self._fileno: int | None = None

    def bind(self) -> None:
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_size)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_size)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setblocking(False)
        try:
            sock.bind((self._host, self._port))
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        self._sock, self._fileno = sock, sock.fileno()
        self._poller.subscribe(self._fileno, self._on_accept,
                               POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)

    def unbind(self) -> None:
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _on_accept(self, descr: Any, events: int) -> None:
        if events & POLL_EVENT_TYPE.READ and self._sock is not None:
            try:
                sock, _ = self._sock.accept()
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    log.warning("raft: accept failed: %s", exc)
                return
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_size)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_size)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            self._on_new(SecureConnection(self._poller, self._security, socket=sock,
                                          timeout=self._timeout, sendBufferSize=self._send_size,
                                          recvBufferSize=self._recv_size,
                                          keepalive=self._keepalive))
        elif events & POLL_EVENT_TYPE.ERROR:
            log.warning("raft: the listening socket failed")


# -- the transport ---------------------------------------------------------------------------
MESSAGE_TYPES = frozenset({"append_entries", "apply_command", "apply_command_response",
                           "next_node_idx", "request_vote", "response_vote", "timeout_now"})


class WireTransport(TransportBase):
    """PySyncObj's TCP transport over :class:`SecureConnection` and :class:`SecureServer`.

    Beyond the handshake: a peer must name a member of the configuration as its first message
    (PySyncObj also accepted "readonly" observers, which receive the whole log), every later
    message must be a dict of a known type, and a message that PySyncObj fails to handle
    closes that connection instead of disturbing the tick.
    """

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        self.security: WireSecurity = syncObj.doq_wire_security
        self._strangers: dict[str, float] = {}   # address introduced → first refused at
        super().__init__(syncObj, selfNode, otherNodes)
        self.raft_node.addOnTickCallback(self._check_connections)

    def create_server(self) -> SecureServer:
        conf = self.raft_node.conf
        host, port = conf.bindAddress.rsplit(":", 1)
        host = host.strip("[]")
        if host not in ("0.0.0.0", "::"):
            host = globalDnsResolver().resolve(host)
        return SecureServer(self.raft_node.poller, host, port, self.incoming_connection,
                            self.security, sendBufferSize=conf.sendBufferSize,
                            recvBufferSize=conf.recvBufferSize,
                            connectionTimeout=conf.connectionTimeout,
                            keepalive=conf.tcp_keepalive)

    def addNode(self, node: Any) -> None:
        self.nodes.add(node)
        self.node_by_address[node.address] = node
        if self.should_connect(node):
            conf = self.raft_node.conf
            conn = SecureConnection(self.raft_node.poller, self.security,
                                    timeout=conf.connectionTimeout,
                                    sendBufferSize=conf.sendBufferSize,
                                    recvBufferSize=conf.recvBufferSize,
                                    keepalive=conf.tcp_keepalive)
            conn.setOnConnectedCallback(functools.partial(self.outgoing_connected, conn))
            conn.setOnMessageReceivedCallback(functools.partial(self._checked_message, node))
            conn.setOnDisconnectedCallback(functools.partial(self.disconnected, conn))
            self.connections[node] = conn

    def incoming_connection(self, conn: Any) -> None:
        self.unknown_connections.add(conn)
        conn.setOnMessageReceivedCallback(functools.partial(self.introduction, conn))
        conn.setOnDisconnectedCallback(functools.partial(self.disconnected, conn))

    def introduction(self, conn: Any, message: Any) -> None:
        node = self.node_by_address.get(message) if isinstance(message, str) else None
        if node is None or self.should_connect(node):
            # PySyncObj connects from the greater address to the smaller one only: a member
            # this node calls itself never calls in, so that claim is false (and accepting it
            # would replace the real, outgoing connection).
            what = repr(message)[:80] if isinstance(message, str) else type(message).__name__
            why = "not as a member of this cluster's configuration" if node is None else \
                "a member this node calls itself"
            expected = node is None and isinstance(message, str) and self._joining(message)
            if expected:
                why += (" (yet, if a join is being applied; warned if it goes on "
                        f"{JOIN_GRACE:g} s)")
            self.security.refuse(conn.peer, f"it introduced itself as {what}, {why}", expected)
            self.unknown_connections.discard(conn)
            conn.disconnect()
            return
        self.unknown_connections.discard(conn)
        old = self.connections.get(node)
        self.connections[node] = conn
        if old is not None and old is not conn:
            old.setOnDisconnectedCallback(None)
            old.disconnect()
        conn.setOnMessageReceivedCallback(functools.partial(self._checked_message, node))
        self.node_connected(node)

    def _joining(self, address: str) -> bool:
        """Whether a refusal of ``address`` is likely a join being applied: a member hears
        of a new one only when it applies the change, and may be called before that (and a
        joiner before it has the configuration). The first JOIN_GRACE seconds of refusals
        of one address are; later ones are warned about."""
        now = time.monotonic()
        if len(self._strangers) > 1000:
            self._strangers = {a: t for a, t in self._strangers.items()
                               if now - t < JOIN_GRACE}
            if len(self._strangers) > 1000:
                self._strangers.clear()
        first = self._strangers.setdefault(address, now)
        return now - first < JOIN_GRACE

    def _checked_message(self, node: Any, message: Any) -> None:
        if not isinstance(message, dict) or message.get("type") not in MESSAGE_TYPES:
            self._drop_peer(node, "a message of an unknown shape")
            return
        try:
            self.message_received(node, message)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError,
                pickle.UnpicklingError) as exc:
            self._drop_peer(node, f"a malformed {message.get('type')} message ({exc!r})")

    def _drop_peer(self, node: Any, why: str) -> None:
        conn = self.connections.get(node)
        self.security.refuse(getattr(node, "address", str(node)), f"it sent {why}")
        if conn is not None:
            conn.disconnect()

    def _check_connections(self) -> None:
        for conn in list(self.connections.values()) + list(self.unknown_connections):
            conn.check_timeout()
