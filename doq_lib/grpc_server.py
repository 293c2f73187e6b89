"""The gRPC server of gevent mode (``grpc.serving = gevent``, L5): grpcio's server with the
service's handlers, metrics and API-key interceptors; and the TLS credentials of both modes
(grpc_thread.py serves the thread mode)."""
from __future__ import annotations

import logging
import time
from concurrent import futures
from typing import Any, Callable, Iterator

import grpc

from doq_lib.auth import KeyStore
from doq_lib.grpc_api import (
    CODE_KEY,
    MAX_MESSAGE_BYTES,
    MAX_REQUEST_BYTES,
    DoqServicer,
    GrpcAuth,
)
from doq_lib.grpc_requests import Malformed, tolerant_parser
from doq_lib.metrics import Metrics
from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from doq_lib.service import Service
from doq_lib.tls import TlsError, read_file

log = logging.getLogger(__name__)


class MetricsInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Counts every finished call by method and status, and times it (a stream: from its
    start until it ends), into ``doq_grpc_requests_total`` and its duration histogram."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def intercept_service(self, continuation: Callable[..., Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method
        observe = self.metrics.observe_grpc

        def outcome(context: Any, failed: bool) -> str:
            code = context.code() if hasattr(context, "code") else None
            if code is not None:
                return str(code.name)
            if not failed:
                return "OK"
            return "UNKNOWN" if context.is_active() else "CANCELLED"

        if handler.response_streaming:
            inner = handler.stream_stream or handler.unary_stream

            def streaming(request: Any, context: Any) -> Iterator[Any]:
                started, failed = time.perf_counter(), True
                try:
                    yield from inner(request, context)
                    failed = False
                finally:
                    observe(method, outcome(context, failed), time.perf_counter() - started)
            factory = (grpc.stream_stream_rpc_method_handler if handler.request_streaming
                       else grpc.unary_stream_rpc_method_handler)
            behaviour: Callable[..., Any] = streaming
        else:
            inner = handler.stream_unary or handler.unary_unary

            def unary(request: Any, context: Any) -> Any:
                started, failed = time.perf_counter(), True
                try:
                    result = inner(request, context)
                    failed = False
                    return result
                finally:
                    observe(method, outcome(context, failed), time.perf_counter() - started)
            factory = (grpc.stream_unary_rpc_method_handler if handler.request_streaming
                       else grpc.unary_unary_rpc_method_handler)
            behaviour = unary
        return factory(behaviour, request_deserializer=handler.request_deserializer,
                       response_serializer=handler.response_serializer)


class AuthInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Refuses a call without a valid key (UNAUTHENTICATED) or whose key's role may not make
    it (PERMISSION_DENIED), before the handler runs; trailers carry ``doq-error-code``."""

    def __init__(self, auth: GrpcAuth) -> None:
        self.auth = auth

    def intercept_service(self, continuation: Callable[..., Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return handler
        refused = self.auth.refusal(details.method, details.invocation_metadata)
        return handler if refused is None else _refusal(handler, *refused)


class MalformedInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Requests that do not parse are refused with INVALID_ARGUMENT, as in thread mode: the
    handler's deserializer is made tolerant (``Malformed`` instead of an exception); a unary
    call is refused before its handler runs, a stream ends at the bad request (what came
    before it is answered) and is then refused."""

    def __init__(self) -> None:
        self.parsers = {f"/queue.DOQ/{m.name}": tolerant_parser(getattr(pb, m.input_type.name))
                        for m in pb.DESCRIPTOR.services_by_name["DOQ"].methods}

    def intercept_service(self, continuation: Callable[..., Any], details: Any) -> Any:
        handler = continuation(details)
        parse = self.parsers.get(details.method)
        if handler is None or parse is None:
            return handler
        if handler.request_streaming:
            inner = handler.stream_stream or handler.stream_unary

            def streamed(requests: Iterator[Any], context: Any) -> Any:
                bad: list[Malformed] = []

                def until_bad() -> Iterator[Any]:
                    for request in requests:
                        if isinstance(request, Malformed):
                            bad.append(request)
                            return
                        yield request
                if handler.response_streaming:
                    return _then_refuse(inner(until_bad(), context), bad, context)
                answer = inner(until_bad(), context)
                if bad:
                    _refuse_malformed(context, bad[0])
                return answer
            behaviour: Callable[..., Any] = streamed
        else:
            inner = handler.unary_unary or handler.unary_stream

            def single(request: Any, context: Any) -> Any:
                if isinstance(request, Malformed):
                    _refuse_malformed(context, request)
                return inner(request, context)
            behaviour = single
        return _handler_like(handler, behaviour, parse)


def _then_refuse(answers: Iterator[Any], bad: list[Malformed], context: Any) -> Iterator[Any]:
    yield from answers
    if bad:
        _refuse_malformed(context, bad[0])


def _refuse_malformed(context: Any, request: Malformed) -> None:
    context.set_trailing_metadata(((CODE_KEY, "invalid_argument"),))
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)


def _handler_like(handler: Any, behaviour: Callable[..., Any],
                  deserializer: Callable[[bytes], Any] | None = None) -> Any:
    """A handler of ``handler``'s kind running ``behaviour``."""
    if handler.request_streaming and handler.response_streaming:
        factory: Callable[..., Any] = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        factory = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        factory = grpc.unary_stream_rpc_method_handler
    else:
        factory = grpc.unary_unary_rpc_method_handler
    return factory(behaviour, request_deserializer=deserializer or handler.request_deserializer,
                   response_serializer=handler.response_serializer)


def _refusal(handler: Any, status: grpc.StatusCode, code: str, message: str) -> Any:
    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        context.set_trailing_metadata(((CODE_KEY, code),))
        context.abort(status, message)

    return _handler_like(handler, refuse)


def grpc_credentials(cert: str, key: str, client_ca: str = "") -> grpc.ServerCredentials:
    """TLS credentials of the gRPC server; ``client_ca``: clients must present a
    certificate signed by it (mutual TLS)."""
    try:
        pair = (read_file(key), read_file(cert))
        roots = read_file(client_ca) if client_ca else None
    except OSError as exc:
        raise TlsError(f"grpc.tls_cert: cannot read {exc.filename}: {exc.strerror}") from None
    return grpc.ssl_server_credentials([pair], root_certificates=roots,
                                       require_client_auth=bool(client_ca))


def build_server(service: Service, address: str, max_workers: int = 8192,
                 metrics: Metrics | None = None, keys: KeyStore | None = None,
                 credentials: Any = None) -> tuple[grpc.Server, int]:
    """A gRPC server for ``service`` bound to ``address``; returns it and the bound port.
    ``keys``: API keys (None: open); ``credentials``: server TLS credentials (None: plain)."""
    options = [("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
               ("grpc.so_reuseport", 0),
               # Fixed flow-control windows (no BDP probing, which grows them to megabytes
               # per stream): what a client sends ahead of the node's reading is bounded.
               ("grpc.http2.bdp_probe", 0)]
    # Handlers are greenlets (threading is monkey-patched); each open stream holds one.
    auth = GrpcAuth(keys)
    interceptors: list[Any] = [MetricsInterceptor(metrics)] if metrics is not None else []
    interceptors += [AuthInterceptor(auth), MalformedInterceptor()]   # the last: innermost
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=options,
                         maximum_concurrent_rpcs=max_workers, interceptors=interceptors)
    pb_grpc.add_DOQServicer_to_server(DoqServicer(service, auth), server)
    port = server.add_secure_port(address, credentials) if credentials is not None else \
        server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind the gRPC address {address}")
    return server, port

