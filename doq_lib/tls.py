"""TLS contexts (L0): the HTTP server's, and the one requests to other nodes use.

Settings (doq_lib.config): ``http.tls_cert`` / ``http.tls_key`` turn HTTPS on, and
``http.tls_client_ca`` makes it mutual (clients must present a certificate that CA signed);
the ``grpc.*`` keys of the same names do the same for gRPC. ``cluster.tls_ca`` is the CA that
requests to other nodes trust (default: the system's); under mutual TLS they present the
node's own HTTP certificate, which must therefore allow client authentication.
"""
from __future__ import annotations

import ssl


class TlsError(ValueError):
    """A certificate or key cannot be loaded."""


def _load_chain(context: ssl.SSLContext, cert: str, key: str, what: str) -> None:
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"{what}: cannot load the certificate {cert} and key {key}: "
                       f"{getattr(exc, 'strerror', None) or exc}") from None


def _load_ca(context: ssl.SSLContext, ca: str, what: str) -> None:
    try:
        context.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"{what}: cannot load the CA certificates {ca}: "
                       f"{getattr(exc, 'strerror', None) or exc}") from None


def server_context(cert: str, key: str, client_ca: str = "",
                   what: str = "http.tls_cert") -> ssl.SSLContext:
    """A server context (TLS 1.2 or newer); ``client_ca``: clients must present a
    certificate signed by it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert, key, what)
    if client_ca:
        _load_ca(context, client_ca, what.replace("tls_cert", "tls_client_ca"))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def peer_context(ca: str = "", cert: str = "", key: str = "") -> ssl.SSLContext:
    """The client context for requests to other nodes: verifies them against ``ca`` (default:
    the system's CAs) and presents ``cert`` when given (mutual TLS)."""
    context = ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca:
        _load_ca(context, ca, "cluster.tls_ca")
    if cert:
        _load_chain(context, cert, key, "http.tls_cert")
    return context


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
