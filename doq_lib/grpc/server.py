"""The node's gRPC server (L5): a gevent server whose connections are served in the event loop
by :class:`~doq_lib.grpc.connection.Connection` (HTTP/2 by h2; see that module for how calls
run and what is bounded).
"""
from __future__ import annotations

import logging
import socket
import time
from typing import Any

import gevent
import gevent.event
import gevent.server
import h2.exceptions

from doq_lib.grpc.api import DoqServicer, GrpcAuth
from doq_lib.grpc.calls import Method
from doq_lib.grpc.connection import CONNECTION_BYTES, FIRST_BYTES_SECONDS, Connection
from doq_lib.log import RateLimited, handshake_or_refuse
from doq_lib.metrics import Metrics
from doq_lib.pb import doq_pb2 as pb

log = logging.getLogger(__name__)
_REFUSED_TLS = RateLimited(log)             # failed handshakes: a few lines a minute at most


class _Listener(gevent.server.StreamServer):  # type: ignore[misc]  # (gevent: no annotations)
    def wrap_socket_and_handle(self, client_socket: Any, address: Any) -> Any:
        """TLS: a failed handshake is one log line (:func:`doq_lib.log.handshake_or_refuse`)."""
        client_socket.settimeout(FIRST_BYTES_SECONDS)             # bounds the handshake
        return handshake_or_refuse(
            lambda: super(_Listener, self).wrap_socket_and_handle(client_socket, address),
            client_socket, address, _REFUSED_TLS, "gRPC: TLS handshake")


class HubServer:
    """The node's gRPC server (see the module notes): ``bind`` listens,
    ``stop(grace)`` as ``grpc.Server.stop``."""

    def __init__(self, servicer: DoqServicer, auth: GrpcAuth, address: str,
                 metrics: Metrics | None = None, ssl_context: Any = None,
                 max_concurrent: int = 1000, max_active: int = 8192,
                 max_connections: int = 10000, max_held_bytes: int = 256 << 20) -> None:
        self.servicer, self.auth, self.metrics = servicer, auth, metrics
        self.address, self.ssl_context = address, ssl_context
        self.max_concurrent = max_concurrent
        self.methods = {f"/queue.DOQ/{m.name}": Method(m.name, servicer)
                        for m in pb.DESCRIPTOR.services_by_name["DOQ"].methods}
        self.connections: set[Connection] = set()
        self.active = 0                                   # calls running, every connection
        self.max_active = max_active
        self.max_connections = max_connections
        self.max_held_bytes = max_held_bytes                 # see connection.py's module notes
        self.connection_bytes = min(max_held_bytes, CONNECTION_BYTES)
        self.held = 0                                        # request bytes held, all calls
        self._server: _Listener | None = None
        self._stopped = gevent.event.Event()

    def observe(self, method: str, code: str, started: float) -> None:
        if self.metrics is not None:
            self.metrics.observe_grpc(method, code, time.perf_counter() - started)

    def bind(self) -> int:
        host, _, port = self.address.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, int(port)))
            listener.listen(1024)
        except (OSError, ValueError) as exc:
            listener.close()
            raise OSError(f"cannot serve gRPC on {self.address}: {exc}") from None
        kwargs = {"ssl_context": self.ssl_context} if self.ssl_context is not None else {}
        self._server = _Listener(listener, self._handle, **kwargs)
        return int(listener.getsockname()[1])

    def start(self) -> None:
        assert self._server is not None
        self._server.start()

    def _handle(self, sock: Any, address: Any) -> None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        connection = Connection(self, sock)
        if len(self.connections) >= self.max_connections:
            connection.refusing = (f"the node has {len(self.connections)} gRPC connections "
                                   f"open (at most {self.max_connections}, "
                                   "grpc.max_connections): retry later")
        self.connections.add(connection)
        try:
            connection.serve()
        finally:
            self.connections.discard(connection)

    def stop(self, grace: float | None = None) -> gevent.event.Event:
        """Refuse new calls (GOAWAY), let running ones end for ``grace`` seconds, then
        cancel them."""
        if self._server is None or self._stopped.is_set():
            self._stopped.set()
            return self._stopped
        self._server.close()
        for connection in list(self.connections):
            with connection.lock:
                try:
                    connection.h2.close_connection(
                        last_stream_id=max(connection.calls, default=0))
                except h2.exceptions.ProtocolError:
                    pass
                connection.flush()
        gevent.spawn(self._finish, grace or 0)
        return self._stopped                # wait(timeout), as grpc.Server.stop's answer

    def _finish(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        while any(c.calls for c in self.connections) and time.monotonic() < deadline:
            gevent.sleep(0.05)
        for connection in list(self.connections):
            connection.closed = True
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._stopped.set()


def build_hub_server(service: Any, address: str, metrics: Metrics | None = None,
                     keys: Any = None, ssl_context: Any = None, max_connections: int = 10000,
                     max_held_bytes: int = 256 << 20) -> tuple[HubServer, int]:
    """The server and the port it bound (``address`` may ask for port 0)."""
    auth = GrpcAuth(keys)
    server = HubServer(DoqServicer(service, auth), auth, address, metrics, ssl_context,
                       max_connections=max_connections, max_held_bytes=max_held_bytes)
    return server, server.bind()
