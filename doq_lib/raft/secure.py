"""One secured Raft connection: the handshake, keys and frames (:class:`WireSecurity`,
:class:`SecureConnection`), and :func:`probe`, the handshake of a blocking client.
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import logging
import os
import socket
import struct
import time
from typing import Any, Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from doq_lib.raft.codec import dumps, loads_frame
from doq_lib.raft.engine import CONNECTION_STATE, POLL_EVENT_TYPE, address_family, set_keepalive

# The Raft wire's logger: its records keep the name they had before this module was split out.
log = logging.getLogger("doq_lib.raft.wire")

MAGIC = b"DOQRAFT2"          # 2: the handshake carries the cluster's id
FLAG_SECRET = 0x01
NONCE = 32
PROOF = 32
CLUSTER = 16                  # the cluster's id (zeros: not named yet)
HELLO = struct.Struct(f">8sB{NONCE}s{CLUSTER}s")                 # connecting side
REPLY = struct.Struct(f">8sB{NONCE}s{CLUSTER}s{PROOF}s")         # accepting side
NO_CLUSTER = bytes(CLUSTER)
LENGTH = struct.Struct(">I")
MAX_FRAME = 64 << 20          # PySyncObj sends up to 16 MiB of entries per message (node.py)
WARN_EVERY = 60.0             # seconds between repeated warnings about one peer

_outgoing_source: list[str | None] = [None]


def set_outgoing_source(host: str | None) -> None:
    """Outgoing Raft connections (and probes) of this process start from ``host``."""
    _outgoing_source[0] = host


# -- security --------------------------------------------------------------------------------
class WireSecurity:
    """What a node's connections need: the Raft key (None: no secret), the cluster's id (a
    function: it is learnt from the log once the first leader names the cluster) and
    warning bookkeeping."""

    def __init__(self, key: bytes | None, cluster_id: Callable[[], str] = lambda: "") -> None:
        self.key = key
        self._cluster_id = cluster_id
        self._warned: dict[str, float] = {}
        self.refused = 0                          # handshakes refused (tests, metrics)

    @property
    def flags(self) -> int:
        return FLAG_SECRET if self.key else 0

    def cluster(self) -> bytes:
        """This node's cluster id as sent in a handshake (zeros: not named yet)."""
        try:
            return bytes.fromhex(self._cluster_id())[:CLUSTER].ljust(CLUSTER, b"\0")
        except ValueError:
            return NO_CLUSTER

    def stranger(self, theirs: bytes) -> str | None:
        """Why a peer presenting cluster id ``theirs`` is refused (None: it is not): both
        sides know their cluster and they differ, so it holds another cluster's data."""
        mine = self.cluster()
        if theirs == NO_CLUSTER or mine == NO_CLUSTER or hmac.compare_digest(theirs, mine):
            return None
        return (f"it belongs to another cluster (id {theirs.hex()}, this node's is "
                f"{mine.hex()}): a node started on another cluster's data")

    def proof(self, label: bytes, nonce_c: bytes, nonce_s: bytes, bound: bytes = b"") -> bytes:
        """The HMAC one side proves the secret with, over both nonces and ``bound`` (the
        two cluster ids, so that neither can be changed on the way)."""
        if self.key is None:
            return bytes(PROOF)
        return hmac.new(self.key, label + nonce_c + nonce_s + bound, hashlib.sha256).digest()

    def session(self, nonce_c: bytes, nonce_s: bytes, outgoing: bool) -> tuple[Any, Any]:
        """(AEAD for what this side sends, AEAD for what it receives), or (None, None)."""
        if self.key is None:
            return None, None
        c2s = AESGCM(self.proof(b"doq-raft key c2s", nonce_c, nonce_s))
        s2c = AESGCM(self.proof(b"doq-raft key s2c", nonce_c, nonce_s))
        return (c2s, s2c) if outgoing else (s2c, c2s)

    def refuse(self, peer: str, why: str, expected: bool = False) -> None:
        """Count a refusal; warn at most once a minute per host and reason (a client that
        reconnects from ever new ports must not flood the log). An ``expected`` one (a
        member not yet in this node's configuration while a join is applied) is told at
        INFO."""
        self.refused += 1
        if expected:
            log.info("raft: refused a connection with %s: %s", peer, why)
            return
        now = time.monotonic()
        key = f"{peer.rpartition(':')[0] or peer} {why[:40]}"
        if now - self._warned.get(key, -WARN_EVERY) >= WARN_EVERY:
            if len(self._warned) > 1000:
                self._warned.clear()
            self._warned[key] = now
            log.warning("raft: refused a connection with %s: %s", peer, why)


def _nonce(counter: int) -> bytes:
    return counter.to_bytes(12, "big")


# -- connections -----------------------------------------------------------------------------
_OUT_HELLO, _OUT_REPLY, _IN_HELLO, _IN_PROOF, _READY = range(5)
_KEEPALIVE = object()


class SecureConnection:
    """Drop-in for PySyncObj's ``TcpConnection`` with the handshake and codec above.

    The transport sees ``CONNECTED`` (and, for an outgoing connection, its connected callback)
    only once the handshake is complete; until then nothing it sends goes out and nothing
    received reaches it.
    """

    _state: int                                # PySyncObj's CONNECTION_STATE

    def __init__(self, poller: Any, security: WireSecurity, onMessageReceived: Any = None,
                 onConnected: Any = None, onDisconnected: Any = None, socket: Any = None,
                 timeout: float = 10.0, sendBufferSize: int = 2 ** 13,
                 recvBufferSize: int = 2 ** 13, keepalive: Any = None) -> None:
        self.encryptor = None                  # PySyncObj's own encryption stays off
        self.sendRandKey: Any = None
        self.recvRandKey: Any = None
        self._poller = poller
        self._security = security
        self._timeout = timeout
        self._send_size, self._recv_size = sendBufferSize, recvBufferSize
        self._keepalive = keepalive
        self._on_message = onMessageReceived
        self._on_connected = onConnected
        self._on_disconnected = onDisconnected
        self._sock: Any = None
        self._fileno: int | None = None
        self._reset()
        if socket is not None:                   # accepted by the server
            self._sock = socket
            self._fileno = socket.fileno()
            self.peer = _peer_name(socket)
            self._state = CONNECTION_STATE.CONNECTING
            self._phase = _IN_HELLO
            self._apply_keepalive()
            self._subscribe(True)

    def _reset(self) -> None:
        self._sock = None
        self._fileno = None
        self._state = CONNECTION_STATE.DISCONNECTED
        self._phase = _OUT_HELLO
        self._rbuf = bytearray()
        self._wbuf = bytearray()
        self._started = time.monotonic()
        self._last_read = self._started
        self._nonce_c = self._nonce_s = b""
        self._cluster_c = self._cluster_s = NO_CLUSTER
        self._seal: Any = None
        self._open: Any = None
        self._sent = self._received = 0
        self._last_sent = self._started
        self._want_write = True
        self.peer = "?"

    # -- PySyncObj's interface -----------------------------------------------------------------
    def setOnConnectedCallback(self, callback: Any) -> None:
        self._on_connected = callback

    def setOnMessageReceivedCallback(self, callback: Any) -> None:
        self._on_message = callback

    def setOnDisconnectedCallback(self, callback: Any) -> None:
        self._on_disconnected = callback

    @property
    def state(self) -> int:
        return self._state

    def fileno(self) -> int | None:
        return self._fileno

    def getSendBufferSize(self) -> int:
        return len(self._wbuf)

    def connect(self, host: str | None, port: int) -> bool:
        if host is None:
            return False
        self._drop_socket()
        self._reset()
        family = address_family(host)
        sock = socket.socket(family, socket.SOCK_STREAM)
        source = _outgoing_source[0]
        if source is not None and (":" in source) == (family == socket.AF_INET6):
            try:
                sock.bind((source, 0))
            except OSError:
                sock.close()
                return False
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_size)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_size)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self._sock = sock
        self.peer = f"{host}:{port}"
        self._apply_keepalive()
        try:
            sock.connect((host, port))
        except OSError as exc:
            if exc.errno not in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                self._drop_socket()
                self._reset()
                return False
        self._fileno = sock.fileno()
        self._state = CONNECTION_STATE.CONNECTING
        self._subscribe(True)
        return True

    def send(self, message: Any) -> None:
        if self._state != CONNECTION_STATE.CONNECTED:
            return
        if time.monotonic() - self._last_read > self._timeout:
            self.disconnect()                  # the peer went silent: do not queue more
            return
        body = dumps(message)
        if len(body) > MAX_FRAME - 16:
            log.error("raft: a message of %d bytes is above the frame limit; connection to "
                      "%s closed", len(body), self.peer)
            self.disconnect()
            return
        self._send_frame(body)

    def _send_frame(self, body: bytes) -> None:
        if self._seal is not None:
            body = self._seal.encrypt(_nonce(self._sent), body, None)
            self._sent += 1
        self._wbuf += LENGTH.pack(len(body))
        self._wbuf += body
        self._last_sent = time.monotonic()
        self._flush()

    def disconnect(self) -> None:
        notify = self._on_disconnected is not None and \
            self._state != CONNECTION_STATE.DISCONNECTED
        self._drop_socket()
        self._reset()
        if notify:
            self._on_disconnected()

    def check_timeout(self) -> None:
        """Close a connection whose handshake stalls or whose peer went silent."""
        if self._state == CONNECTION_STATE.DISCONNECTED:
            return
        now = time.monotonic()
        if self._phase != _READY:
            if now - self._started > self._timeout:
                if self._phase != _OUT_HELLO:        # else: TCP never connected (peer away)
                    self._security.refuse(self.peer, "the handshake did not complete in time")
                self.disconnect()
        elif now - self._last_read > self._timeout:
            self.disconnect()
        elif now - self._last_sent > self._timeout / 3:
            self._send_frame(b"")                 # keepalive

    # -- events -------------------------------------------------------------------------------
    def _apply_keepalive(self) -> None:
        if self._sock is not None and self._keepalive is not None:
            set_keepalive(self._sock, *self._keepalive)

    def _subscribe(self, write: bool) -> None:
        events = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
        if write:
            events |= POLL_EVENT_TYPE.WRITE
        self._want_write = write
        self._poller.subscribe(self._fileno, self._on_event, events)

    def _drop_socket(self) -> None:
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
        if self._sock is not None:
            self._sock.close()

    def _on_event(self, descr: Any, events: int) -> None:
        if descr != self._fileno:
            self._poller.unsubscribe(descr)
            return
        if events & POLL_EVENT_TYPE.ERROR:
            self.disconnect()
            return
        if self._state == CONNECTION_STATE.CONNECTING and self._phase == _OUT_HELLO:
            if self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.disconnect()
                return
            self._nonce_c = os.urandom(NONCE)
            self._cluster_c = self._security.cluster()
            self._wbuf += HELLO.pack(MAGIC, self._security.flags, self._nonce_c,
                                     self._cluster_c)
            self._phase = _OUT_REPLY
        if events & POLL_EVENT_TYPE.WRITE or self._wbuf:
            self._flush()
        if self._state == CONNECTION_STATE.DISCONNECTED:
            return
        if events & POLL_EVENT_TYPE.READ:
            self._read()

    def _flush(self) -> None:
        while self._wbuf:
            try:
                sent = self._sock.send(self._wbuf)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    self.disconnect()
                    return
                break
            if sent <= 0:
                break
            del self._wbuf[:sent]
        if self._fileno is not None and self._want_write != bool(self._wbuf):
            self._subscribe(bool(self._wbuf))

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(self._recv_size)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    self.disconnect()
                    return
                break
            if not data:
                self.disconnect()
                return
            self._rbuf += data
        self._last_read = time.monotonic()
        self._process()

    def _process(self) -> None:
        """Handle every complete handshake step and frame in the read buffer."""
        pos = 0
        buf = self._rbuf
        while self._state != CONNECTION_STATE.DISCONNECTED:
            if self._phase != _READY:
                used = self._handshake(buf, pos)
                if self._rbuf is not buf:
                    return
                if used == 0:
                    break
                pos += used
                continue
            if len(buf) - pos < LENGTH.size:
                break
            (length,) = LENGTH.unpack_from(buf, pos)
            if length > MAX_FRAME:
                self._security.refuse(self.peer, f"a frame of {length} bytes is too large")
                self.disconnect()
                return
            if len(buf) - pos - LENGTH.size < length:
                break
            body = bytes(buf[pos + LENGTH.size:pos + LENGTH.size + length])
            pos += LENGTH.size + length
            ok, message = self._decode(body)
            if not ok:
                return
            if message is not _KEEPALIVE and self._on_message is not None:
                self._on_message(message)
            if self._rbuf is not buf:           # the callback closed (or reopened) it
                return
        if self._rbuf is buf and pos:
            del buf[:pos]

    def _decode(self, body: bytes) -> tuple[bool, Any]:
        """(True, message or _KEEPALIVE), or (False, None) after closing the connection."""
        try:
            if self._open is not None:
                body = self._open.decrypt(_nonce(self._received), body, None)
                self._received += 1
            return True, loads_frame(body) if body else _KEEPALIVE
        except InvalidTag:
            self._security.refuse(self.peer, "a frame failed authentication")
        except Exception as exc:  # noqa: BLE001 - anything undecodable ends the connection
            self._security.refuse(self.peer, f"an undecodable frame ({exc})")
        self.disconnect()
        return False, None

    # -- handshake ----------------------------------------------------------------------------
    def _handshake(self, buf: bytearray, pos: int) -> int:
        """Consume one handshake step from ``buf`` at ``pos``; the bytes used (0: need more)."""
        step = {_OUT_REPLY: (REPLY.size, self._got_reply),
                _IN_HELLO: (HELLO.size, self._got_hello),
                _IN_PROOF: (PROOF, self._got_proof)}.get(self._phase)
        if step is None or len(buf) - pos < step[0]:
            return 0
        size, handler = step
        handler(bytes(buf[pos:pos + size]))
        return size

    def _refuse(self, why: str) -> None:
        self._security.refuse(self.peer, why)
        self.disconnect()

    def _got_hello(self, raw: bytes) -> None:
        magic, flags, nonce_c, cluster_c = HELLO.unpack(raw)
        if magic != MAGIC:
            self._refuse("it does not speak DOQ's Raft protocol (or an older version of it)")
            return
        if flags & FLAG_SECRET != self._security.flags:
            self._refuse("the peer has no cluster secret" if self._security.key
                         else "the peer has a cluster secret and this node none")
            return
        stranger = self._security.stranger(cluster_c)
        if stranger:
            self._refuse(stranger)
            return
        self._nonce_c, self._nonce_s = nonce_c, os.urandom(NONCE)
        self._cluster_c, self._cluster_s = cluster_c, self._security.cluster()
        proof = self._security.proof(b"doq-raft server", nonce_c, self._nonce_s,
                                     cluster_c + self._cluster_s)
        self._wbuf += REPLY.pack(MAGIC, self._security.flags, self._nonce_s, self._cluster_s,
                                 proof)
        if self._security.key:
            self._phase = _IN_PROOF
        else:
            self._ready(outgoing=False)
        self._flush()

    def _got_reply(self, raw: bytes) -> None:
        magic, flags, nonce_s, cluster_s, proof = REPLY.unpack(raw)
        security = self._security
        if magic != MAGIC:
            self._refuse("it does not speak DOQ's Raft protocol (or an older version of it)")
            return
        if flags & FLAG_SECRET != security.flags:
            self._refuse("the peer has no cluster secret" if security.key
                         else "the peer has a cluster secret and this node none")
            return
        bound = self._cluster_c + cluster_s
        expected = security.proof(b"doq-raft server", self._nonce_c, nonce_s, bound)
        if not hmac.compare_digest(proof, expected):
            self._refuse("the peer does not know the cluster secret")
            return
        stranger = security.stranger(cluster_s)
        if stranger:
            self._refuse(stranger)
            return
        self._nonce_s, self._cluster_s = nonce_s, cluster_s
        if security.key:
            self._wbuf += security.proof(b"doq-raft client", self._nonce_c, nonce_s, bound)
        self._ready(outgoing=True)
        self._flush()
        if self._state == CONNECTION_STATE.CONNECTED and self._on_connected is not None:
            self._on_connected()

    def _got_proof(self, raw: bytes) -> None:
        expected = self._security.proof(b"doq-raft client", self._nonce_c, self._nonce_s,
                                        self._cluster_c + self._cluster_s)
        if not hmac.compare_digest(raw, expected):
            self._refuse("the peer does not know the cluster secret")
            return
        self._ready(outgoing=False)

    def _ready(self, outgoing: bool) -> None:
        self._seal, self._open = self._security.session(self._nonce_c, self._nonce_s, outgoing)
        self._phase = _READY
        self._state = CONNECTION_STATE.CONNECTED
        self._last_read = time.monotonic()


def _peer_name(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"

# -- probing a peer (membership) -------------------------------------------------------------
class ProbeFailed(Exception):
    """The address did not complete a Raft handshake."""


def probe(address: str, security: WireSecurity, timeout: float = 3.0) -> None:
    """Connect to a Raft address and complete the handshake (with a secret: both sides prove
    they hold it); raises :class:`ProbeFailed` saying why not. Blocks the calling greenlet or
    thread only (sockets are cooperative under gevent)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    source = _outgoing_source[0]
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout,
                                        source_address=(source, 0) if source else None)
    except (OSError, ValueError) as exc:
        raise ProbeFailed(f"cannot connect to {address}: {exc}") from None
    try:
        sock.settimeout(timeout)
        nonce_c = os.urandom(NONCE)
        cluster_c = security.cluster()
        sock.sendall(HELLO.pack(MAGIC, security.flags, nonce_c, cluster_c))
        raw = _recv_exact(sock, REPLY.size)
        magic, flags, nonce_s, cluster_s, proof = REPLY.unpack(raw)
        if magic != MAGIC:
            raise ProbeFailed(f"{address} does not speak DOQ's Raft protocol")
        if flags & FLAG_SECRET != security.flags:
            raise ProbeFailed(f"{address} has no cluster secret" if security.key else
                              f"{address} expects a cluster secret and this node has none")
        if not hmac.compare_digest(proof, security.proof(b"doq-raft server", nonce_c, nonce_s,
                                                         cluster_c + cluster_s)):
            raise ProbeFailed(f"{address} does not know the cluster secret")
        stranger = security.stranger(cluster_s)
        if stranger:
            raise ProbeFailed(f"{address}: {stranger}")
    except OSError as exc:
        raise ProbeFailed(f"{address} did not complete the Raft handshake: {exc}") from None
    finally:
        sock.close()


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            raise OSError("the connection was closed during the handshake")
        data += more
    return data
