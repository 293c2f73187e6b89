"""Kubernetes mode (L4; SPEC §7.4, §7.5): discovery and the leader-following service.

Used by the server only when ``cluster.service_name`` is set. At start-up (SPEC §7.6 step 2)::

    discovery = k8s.discover_with_retries(cfg)            # DiscoveryError: fatal
    cfg = k8s.with_discovery(cfg, discovery)              # node id, raft.address, join_addr
    slice_leader = k8s.EndpointSliceLeader.from_environment(cfg)   # DiscoveryError: fatal

and on every leadership gain (never blocking the Raft loop; losing leadership does nothing)::

    gevent.spawn(slice_leader.mark_leader_while, lambda: node.is_leader)

Discovery reads the SRV records of the headless ``<service_name>-internal`` service: each
record is one pod, ``<target>:<port>`` (a port of 0 means ``http.port``). The pod's own record
gives its node id, the others are the HTTP addresses of the members it may join through.

**Deterministic bootstrap.** Only the pod with StatefulSet ordinal 0 (hostname ``<name>-0``)
bootstraps a cluster; every other pod joins one. Deciding from what DNS shows instead ("nobody
else is listed, so I bootstrap") races: pods start in parallel and the headless service lags
behind them, so two pods could each see nobody and each form a cluster of their own, and Raft
can never merge two clusters. The ordinal is known before any lookup and no two pods share
it. Caveat: a bootstrap happens only on a node's first start with empty data (see
``cluster.bootstrap_peers``); if pod 0 loses its volume while the others run, it would form a
new cluster, so give it its data back or remove it from the old cluster first.

The leader-following service (SPEC §7.5): the client service ``<service_name>`` has no pod
selector; the leader replaces its one EndpointSlice with one pointing at itself. The
Kubernetes API is called with the standard library only, with short timeouts.
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import re
import socket
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import dns.exception
import dns.resolver
import gevent

from doq_lib.client.transport import Transport
from doq_lib.config import Config, split_host_port

log = logging.getLogger(__name__)

DEFAULT_RAFT_PORT = 9000
#: Seconds one SRV lookup may take, every retry of the resolver included.
DNS_LIFETIME = 5.0
#: Seconds one Kubernetes API request may take (connect, send, answer).
API_TIMEOUT = 5.0
#: Where Kubernetes mounts the pod's service-account credentials.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_FILE, CA_FILE = "token", "ca.crt"
SLICE_API = "/apis/discovery.k8s.io/v1"
_POD_NAME_RE = re.compile(r"(?P<set>.+)-(?P<ordinal>[0-9]+)")

Sleep = Callable[[float], Any]


class DiscoveryError(Exception):
    """Kubernetes discovery failed; fatal at start-up (SPEC §7.4). The message says why."""


class EndpointSliceError(Exception):
    """The Kubernetes API did not replace the EndpointSlice; the caller retries."""


@dataclass(frozen=True)
class Discovery:
    """What a pod learned about itself and its cluster (SPEC §7.4).

    ``node_id``: own SRV record ``<target>:<port>`` (or the derived fallback when DNS does not
    list this pod yet); ``raft_address``: ``host(node_id):<raft port>``; ``http_peers``: the
    other pods' HTTP ``host:port``, lowest ordinal first (pod 0 bootstraps, so it is up
    first); ``bootstrap``: True only for ordinal 0, which forms the cluster the others join.
    """

    node_id: str
    raft_address: str
    http_peers: list[str]
    bootstrap: bool


@dataclass(frozen=True, order=True)
class SrvRecord:
    """One SRV answer: ``target`` is absolute (ends with a dot)."""

    target: str
    port: int


# -- names and addresses ---------------------------------------------------------------------
def srv_name(cfg: Config) -> str:
    """The absolute name looked up: ``<service_name>-internal.<namespace>.svc.cluster.local.``"""
    return f"{cfg.cluster.service_name}-internal.{cfg.cluster.namespace}.svc.cluster.local."


def pod_ordinal(hostname: str) -> int:
    """The StatefulSet ordinal N of a pod named ``<name>-<N>`` (DiscoveryError otherwise)."""
    match = _POD_NAME_RE.fullmatch(_first_label(hostname))
    if match is None:
        raise DiscoveryError(
            f"hostname {hostname!r} is not a StatefulSet pod name <name>-<ordinal>: Kubernetes "
            "mode needs the ordinal to decide which pod bootstraps the cluster")
    return int(match["ordinal"])


def raft_port(configured: str) -> int:
    """The port of the configured ``raft.address`` (``:9000``, ``host:9000`` or ``9000``);
    9000 when it has none."""
    if configured.isascii() and configured.isdigit():
        return int(configured)
    try:
        return split_host_port(configured)[1]
    except ValueError:
        return DEFAULT_RAFT_PORT


def raft_address(configured: str, node_id: str) -> str:
    """``host(node_id):<port of the configured raft.address, or 9000>``."""
    return f"{node_id.rpartition(':')[0]}:{raft_port(configured)}"


def fallback_node_id(cfg: Config, hostname: str) -> str:
    """The id of a pod DNS does not list yet: the name its record will have, ``:<http.port>``."""
    return f"{_first_label(hostname)}.{srv_name(cfg)}:{cfg.http.port}"


def _first_label(name: str) -> str:
    return name.split(".", 1)[0].lower()


def _address(record: SrvRecord, http_port: int) -> str:
    return f"{record.target}:{record.port or http_port}"


def _ordinal_key(record: SrvRecord) -> tuple[int, str]:
    match = _POD_NAME_RE.fullmatch(_first_label(record.target))
    return (int(match["ordinal"]) if match else 1 << 30, record.target)


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


# -- discovery -------------------------------------------------------------------------------
def own_hostname() -> str:
    """The OS hostname (in Kubernetes: the pod name)."""
    try:
        name = socket.gethostname()
    except OSError as exc:
        raise DiscoveryError(f"cannot read this host's name: {exc}") from None
    if not name:
        raise DiscoveryError("this host has an empty hostname")
    return name


def lookup_srv(name: str, resolver: dns.resolver.Resolver | None = None) -> list[SrvRecord]:
    """The SRV records of the absolute ``name``, sorted; DiscoveryError when there are none.

    ``resolver`` defaults to the system's (resolv.conf) with a lifetime of DNS_LIFETIME; a
    given resolver keeps its own timeouts.
    """
    try:
        resolver = resolver or _system_resolver()
        answer = resolver.resolve(name, "SRV", search=False)
    except dns.exception.DNSException as exc:
        raise DiscoveryError(f"SRV lookup of {name} failed: {_dns_problem(exc)}") from None
    return sorted(SrvRecord(rdata.target.to_text(), int(rdata.port))
                  for rdata in answer)


def _system_resolver() -> dns.resolver.Resolver:
    resolver = dns.resolver.Resolver()
    resolver.lifetime = DNS_LIFETIME
    return resolver


def _dns_problem(exc: dns.exception.DNSException) -> str:
    if isinstance(exc, dns.resolver.NXDOMAIN):
        return ("no such name (is the headless service deployed in this namespace, with "
                "publishNotReadyAddresses?)")
    if isinstance(exc, dns.resolver.NoAnswer):
        return "no SRV records (no pod of the service is published yet)"
    return str(exc) or type(exc).__name__


def build_discovery(cfg: Config, hostname: str, records: list[SrvRecord]) -> Discovery:
    """Discovery from SRV records: own record (first label == pod name), peers, bootstrap.

    Matching the whole first label, not a text prefix: pod ``doq-1`` must not take the record
    of ``doq-10``.
    """
    ordinal, pod = pod_ordinal(hostname), _first_label(hostname)
    own = [r for r in records if _first_label(r.target) == pod]
    others = sorted((r for r in records if _first_label(r.target) != pod), key=_ordinal_key)
    node_id = _address(own[0], cfg.http.port) if own else fallback_node_id(cfg, hostname)
    peers = _unique(_address(r, cfg.http.port) for r in others)
    return Discovery(node_id, raft_address(cfg.raft.address, node_id), peers, ordinal == 0)


def discover(cfg: Config, hostname: str | None = None,
             resolver: dns.resolver.Resolver | None = None) -> Discovery:
    """One SRV lookup (SPEC §7.4); every failure is a DiscoveryError with a clear message.

    ``hostname`` defaults to the OS hostname; ``resolver`` to the system's (resolv.conf).
    """
    _require_service_name(cfg)
    hostname = hostname or own_hostname()
    pod_ordinal(hostname)                               # a bad pod name fails before DNS
    return build_discovery(cfg, hostname, lookup_srv(srv_name(cfg), resolver))


def discover_with_retries(cfg: Config, attempts: int = 30, pause: float = 2.0,
                          hostname: str | None = None,
                          resolver: dns.resolver.Resolver | None = None,
                          sleep: Sleep = gevent.sleep) -> Discovery:
    """Discovery at pod start, when the headless service may not list everybody yet.

    The bootstrapper (ordinal 0) needs nobody: one lookup, and if DNS does not answer it
    starts with the derived id. A joiner needs at least one peer: it looks up to ``attempts``
    times, ``pause`` seconds apart, then gives up with a DiscoveryError.
    """
    _require_service_name(cfg)
    hostname = hostname or own_hostname()
    if pod_ordinal(hostname) == 0:
        return _discover_bootstrapper(cfg, hostname, resolver)
    problem = ""
    for attempt in range(attempts):
        if attempt:
            log.info("no cluster member to join yet, looking again in %gs: %s", pause, problem)
            sleep(pause)
        try:
            found = discover(cfg, hostname, resolver)
        except DiscoveryError as exc:
            problem = str(exc)
            continue
        if found.http_peers:
            return found
        problem = f"SRV records of {srv_name(cfg)} list no other pod yet"
    raise DiscoveryError(f"no cluster member to join after {attempts} lookups "
                         f"{pause:g}s apart: {problem}")


def _require_service_name(cfg: Config) -> None:
    if not cfg.cluster.service_name:
        raise DiscoveryError("Kubernetes discovery needs cluster.service_name")


def _discover_bootstrapper(cfg: Config, hostname: str,
                           resolver: dns.resolver.Resolver | None) -> Discovery:
    try:
        return discover(cfg, hostname, resolver)
    except DiscoveryError as exc:
        log.warning("bootstrapping with the derived node id: %s", exc)
        return build_discovery(cfg, hostname, [])


def with_discovery(cfg: Config, found: Discovery) -> Config:
    """``cfg`` with the discovered node id and Raft address; a joiner's ``join_addr`` becomes
    its first peer (the lowest ordinal), unless one was configured."""
    join_addr = cfg.cluster.join_addr
    if not found.bootstrap and found.http_peers and not join_addr:
        join_addr = found.http_peers[0]
    cluster = replace(cfg.cluster, node_id=found.node_id, join_addr=join_addr)
    return replace(cfg, cluster=cluster, raft=replace(cfg.raft, address=found.raft_address))


# -- the leader-following EndpointSlice ----------------------------------------------------
class EndpointSliceLeader:
    """Points the client service at this pod: the EndpointSlice ``<service_name>`` (SPEC §7.5).

    ``api_url`` is the API server (``https://host:port``; ``http://`` in tests); ``token`` the
    bearer token, or a function returning it (service-account tokens rotate, so
    :meth:`from_environment` re-reads the file on each call); ``ca_file`` verifies the API
    server (None: the system's CAs). Every request times out after ``timeout`` seconds.
    """

    def __init__(self, api_url: str, token: str | Callable[[], str], ca_file: str | None,
                 namespace: str, service_name: str, own_ip: str, hostname: str,
                 http_port: int, timeout: float = API_TIMEOUT, grpc_port: int = 0) -> None:
        self.api = urlsplit(api_url)
        self.token, self.ca_file = token, ca_file
        self.namespace, self.service_name = namespace, service_name
        self.own_ip, self.hostname, self.http_port = own_ip, hostname, http_port
        self.grpc_port = grpc_port                     # 0: no gRPC port in the slice
        self.timeout = timeout
        self._tls: ssl.SSLContext | None = None

    @classmethod
    def from_environment(cls, cfg: Config, hostname: str | None = None,
                         environ: Mapping[str, str] | None = None,
                         account_dir: str = SERVICE_ACCOUNT_DIR) -> EndpointSliceLeader:
        """Built from inside a pod: ``KUBERNETES_SERVICE_HOST/PORT``, the service-account
        token and CA, and the pod's IP (its hostname resolved). DiscoveryError if any is
        missing (fatal at start-up, SPEC §7.4)."""
        environ = os.environ if environ is None else environ
        hostname = _first_label(hostname or own_hostname())
        token_path = os.path.join(account_dir, TOKEN_FILE)
        _read_token(token_path)                        # fail now, not at the first election
        grpc_port = split_host_port(cfg.grpc.address)[1] if cfg.grpc.address else 0
        return cls(_api_url(environ), lambda: _read_token(token_path),
                   os.path.join(account_dir, CA_FILE), cfg.cluster.namespace,
                   cfg.cluster.service_name, own_ip(hostname), hostname, cfg.http.port,
                   grpc_port=grpc_port)

    def slice_body(self) -> dict[str, Any]:
        """The EndpointSlice this leader creates (SPEC §7.5), with the port names of the
        client Service: http, and grpc when gRPC is served on a fixed port."""
        name = self.service_name
        return {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": self.namespace,
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.own_ip], "conditions": {"ready": True},
                           "hostname": self.hostname}],
            "ports": [{"name": "http", "port": self.http_port}] + (
                [{"name": "grpc", "port": self.grpc_port}] if self.grpc_port else []),
        }

    def mark_leader(self) -> None:
        """Delete the slice (any failure ignored: it may not exist) and create it anew,
        pointing at this pod. EndpointSliceError (logged) if the creation fails."""
        status, answer = self._try("DELETE", f"{self._collection()}/{self.service_name}")
        if status not in (200, 202, 404):
            log.info("deleting EndpointSlice %s: %s (ignored)", self.service_name, answer)
        status, answer = self._try("POST", self._collection(), self.slice_body())
        if status not in (200, 201, 202):
            log.warning("creating EndpointSlice %s failed: %s", self.service_name, answer)
            raise EndpointSliceError(f"creating EndpointSlice {self.service_name} in "
                                     f"{self.namespace} failed: {answer}")
        log.info("EndpointSlice %s now points at %s", self.service_name, self.own_ip)

    def mark_leader_while(self, still_leader: Callable[[], bool], pause: float = 2.0,
                          sleep: Sleep = gevent.sleep) -> bool:
        """:meth:`mark_leader` until it succeeds (True) or this node stops leading (False);
        meant to run in its own greenlet on each leadership gain."""
        while still_leader():
            try:
                self.mark_leader()
                return True
            except EndpointSliceError:
                sleep(pause)
        return False

    # -- HTTP ----------------------------------------------------------------------------
    def _collection(self) -> str:
        return f"{SLICE_API}/namespaces/{self.namespace}/endpointslices"

    def _try(self, method: str, path: str, body: Any = None) -> tuple[int, str]:
        """(status, short description); status 0 when no answer came."""
        try:
            status, raw = self._request(method, path, body)
        except (OSError, http.client.HTTPException) as exc:
            return 0, f"{method} {path}: {exc or type(exc).__name__}"
        return status, f"{method} {path}: HTTP {status} {_status_message(raw)}".rstrip()

    def _request(self, method: str, path: str, body: Any) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {self._bearer()}", "Accept": "application/json"}
        port = self.api.port or (80 if self.api.scheme == "http" else 443)
        return self._transport().once(f"{self.api.hostname or ''}:{port}", method, path, body,
                                      self.timeout, headers)

    def _transport(self) -> Transport:
        if self.api.scheme == "http":
            return Transport()
        if self._tls is None:
            self._tls = ssl.create_default_context(cafile=self.ca_file)
        return Transport(self._tls)

    def _bearer(self) -> str:
        return self.token if isinstance(self.token, str) else self.token()


def _status_message(raw: bytes) -> str:
    """The ``message`` of a Kubernetes Status answer, else the start of the body."""
    try:
        message = json.loads(raw).get("message", "")
    except (ValueError, AttributeError):
        message = raw[:200].decode("utf-8", "replace")
    return str(message)[:200]


def _read_token(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as exc:
        raise DiscoveryError(f"cannot read the service-account token: {exc}") from None


def _api_url(environ: Mapping[str, str]) -> str:
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    if not host:
        raise DiscoveryError("not inside a Kubernetes pod: KUBERNETES_SERVICE_HOST is not set")
    port = environ.get("KUBERNETES_SERVICE_PORT", "") or "443"
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def own_ip(hostname: str) -> str:
    """This pod's IPv4 address: its hostname resolved (DiscoveryError if it does not)."""
    try:
        return socket.gethostbyname(hostname)
    except OSError as exc:
        raise DiscoveryError(f"cannot resolve this pod's IP from {hostname!r}: {exc}") from None
