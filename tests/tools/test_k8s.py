"""Kubernetes mode (SPEC §7.4, §7.5) against real servers on loopback: a DNS server (dnslib)
answering SRV queries like the cluster DNS, and an HTTP(S) server standing in for the
Kubernetes API's EndpointSlice calls."""
from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import re
import socketserver
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dns.resolver
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from dnslib import QTYPE, RCODE, RR, SRV, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from doq_lib import k8s
from doq_lib.config import ClusterConfig, Config, GrpcConfig, HttpConfig, RaftConfig
from tests.harness import REPO, free_ports

NAMESPACE = "ns"
SRV_NAME = "doq-internal.ns.svc.cluster.local."


def config(namespace: str = NAMESPACE, http_port: int = 8000,
           raft_address: str = ":9000") -> Config:
    return Config(http=HttpConfig(port=http_port),
                  raft=RaftConfig(address=raft_address, password="k8s test cluster secret"),
                  cluster=ClusterConfig(service_name="doq", namespace=namespace))


def pod(n: int, namespace: str = NAMESPACE) -> str:
    return f"doq-{n}.doq-internal.{namespace}.svc.cluster.local."


# -- a real DNS server ---------------------------------------------------------------------
class SrvZone(BaseResolver):  # type: ignore[misc]
    """Answers SRV queries for one name from ``records``; other names are NXDOMAIN.

    The first ``empty_answers`` queries get an empty answer (the service exists, DNS does not
    list its pods yet). Every query is recorded as (name, type).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.records: list[tuple[str, int]] = []
        self.empty_answers = 0
        self.queries: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        reply = request.reply()
        qname = str(request.q.qname)
        with self.lock:
            self.queries.append((qname, QTYPE[request.q.qtype]))
            empty = len(self.queries) <= self.empty_answers
        if qname.lower() != self.name:
            reply.header.rcode = RCODE.NXDOMAIN
        elif not empty and request.q.qtype == QTYPE.SRV:
            for target, port in self.records:
                reply.add_answer(RR(qname, QTYPE.SRV, ttl=5,
                                    rdata=SRV(priority=0, weight=100, port=port, target=target)))
        return reply


@contextlib.contextmanager
def serving(server: socketserver.BaseServer) -> Iterator[None]:
    """Serve in a thread for the duration of the block (stops within 50 ms)."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def resolver_for(port: int) -> dns.resolver.Resolver:
    """A resolver asking only 127.0.0.1:port, giving up after 2 s."""
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers, resolver.port = ["127.0.0.1"], port
    resolver.timeout = resolver.lifetime = 2.0
    return resolver


@dataclass
class FakeDns:
    zone: SrvZone
    resolver: dns.resolver.Resolver


@pytest.fixture
def cluster_dns() -> Iterator[FakeDns]:
    zone = SrvZone(SRV_NAME)
    server = DNSServer(zone, address="127.0.0.1", port=0,
                       logger=DNSLogger(log="-request,-reply", logf=lambda _: None))
    with serving(server.server):
        yield FakeDns(zone, resolver_for(server.server.server_address[1]))


def discover(fake: FakeDns, hostname: str, cfg: Config | None = None) -> k8s.Discovery:
    return k8s.discover(cfg or config(), hostname, fake.resolver)


# -- discovery -------------------------------------------------------------------------------
def test_srv_records_become_target_port_and_peers_exclude_self(cluster_dns: FakeDns) -> None:
    cluster_dns.zone.records = [(pod(2), 8000), (pod(0), 8000), (pod(1), 8000)]
    found = discover(cluster_dns, "doq-1")
    assert found == k8s.Discovery(
        node_id=f"{pod(1)}:8000", raft_address=f"{pod(1)}:9000",
        http_peers=[f"{pod(0)}:8000", f"{pod(2)}:8000"], bootstrap=False)
    assert cluster_dns.zone.queries == [(SRV_NAME, "SRV")]


def test_own_record_is_matched_by_the_whole_pod_name(cluster_dns: FakeDns) -> None:
    cluster_dns.zone.records = [(pod(10), 8000), (pod(1), 8000), (pod(2), 8000)]
    found = discover(cluster_dns, "doq-1")
    assert found.node_id == f"{pod(1)}:8000"
    assert found.http_peers == [f"{pod(2)}:8000", f"{pod(10)}:8000"]   # by ordinal


def test_port_zero_is_replaced_by_the_http_port(cluster_dns: FakeDns) -> None:
    cluster_dns.zone.records = [(pod(0), 0), (pod(1), 0)]
    found = discover(cluster_dns, "doq-1", config(http_port=8123))
    assert found.node_id == f"{pod(1)}:8123"
    assert found.http_peers == [f"{pod(0)}:8123"]


@pytest.mark.parametrize(("configured", "port"), [
    (":9000", 9000), ("localhost:9100", 9100), ("9200", 9200), ("localhost", 9000), ("", 9000)])
def test_raft_address_is_node_host_and_configured_port(
        cluster_dns: FakeDns, configured: str, port: int) -> None:
    cluster_dns.zone.records = [(pod(0), 8000), (pod(1), 8000)]
    found = discover(cluster_dns, "doq-1", config(raft_address=configured))
    assert found.raft_address == f"{pod(1)}:{port}"


def test_self_not_in_srv_falls_back_to_the_derived_id() -> None:
    zone = SrvZone("doq-internal.test-namespace.svc.cluster.local.")
    zone.records = [(pod(0, "test-namespace"), 8000), (pod(1, "test-namespace"), 8000)]
    server = DNSServer(zone, address="127.0.0.1", port=0,
                       logger=DNSLogger(log="-request,-reply", logf=lambda _: None))
    with serving(server.server):
        resolver = resolver_for(server.server.server_address[1])
        found = k8s.discover(config(namespace="test-namespace"), "doq-3", resolver)
    assert found.node_id == "doq-3.doq-internal.test-namespace.svc.cluster.local.:8000"
    assert found.raft_address == "doq-3.doq-internal.test-namespace.svc.cluster.local.:9000"
    assert found.http_peers == [f"{pod(0, 'test-namespace')}:8000",
                                f"{pod(1, 'test-namespace')}:8000"]


@pytest.mark.parametrize(("hostname", "bootstrap"), [
    ("doq-0", True), ("doq-1", False), ("doq-2", False), ("doq-10", False)])
def test_only_ordinal_zero_bootstraps(cluster_dns: FakeDns, hostname: str,
                                      bootstrap: bool) -> None:
    cluster_dns.zone.records = [(pod(n), 8000) for n in (0, 1, 2, 10)]
    assert discover(cluster_dns, hostname).bootstrap is bootstrap


def test_hostname_without_ordinal_is_a_clear_error(cluster_dns: FakeDns) -> None:
    with pytest.raises(k8s.DiscoveryError, match="not a StatefulSet pod name"):
        discover(cluster_dns, "doq")
    assert cluster_dns.zone.queries == []                # failed before any lookup


def test_unknown_name_is_a_clear_error(cluster_dns: FakeDns) -> None:
    with pytest.raises(k8s.DiscoveryError) as info:
        discover(cluster_dns, "doq-1", config(namespace="elsewhere"))
    message = str(info.value)
    assert "SRV lookup of doq-internal.elsewhere.svc.cluster.local." in message
    assert "no such name" in message


def test_no_records_is_a_clear_error(cluster_dns: FakeDns) -> None:
    with pytest.raises(k8s.DiscoveryError, match="no SRV records"):
        discover(cluster_dns, "doq-1")


def test_unreachable_dns_server_is_a_clear_error() -> None:
    resolver = resolver_for(free_ports(1)[0])
    resolver.timeout = resolver.lifetime = 0.3
    with pytest.raises(k8s.DiscoveryError, match=f"SRV lookup of {SRV_NAME} failed"):
        k8s.discover(config(), "doq-1", resolver)


@pytest.mark.parametrize("hostname", ["doq-0", "doq-1"])
def test_missing_service_name_is_a_clear_error(hostname: str) -> None:
    with pytest.raises(k8s.DiscoveryError, match="cluster.service_name"):
        k8s.discover(Config(), hostname)
    with pytest.raises(k8s.DiscoveryError, match="cluster.service_name"):
        k8s.discover_with_retries(Config(), hostname=hostname, sleep=lambda _: None)


def test_joiner_retries_until_a_peer_is_listed(cluster_dns: FakeDns) -> None:
    cluster_dns.zone.records = [(pod(0), 8000), (pod(1), 8000)]
    cluster_dns.zone.empty_answers = 2
    pauses: list[float] = []
    found = k8s.discover_with_retries(config(), attempts=5, pause=0.25, hostname="doq-1",
                                      resolver=cluster_dns.resolver, sleep=pauses.append)
    assert found.http_peers == [f"{pod(0)}:8000"]
    assert len(cluster_dns.zone.queries) == 3 and pauses == [0.25, 0.25]


def test_joiner_keeps_waiting_while_only_itself_is_listed(cluster_dns: FakeDns) -> None:
    cluster_dns.zone.records = [(pod(1), 8000)]
    with pytest.raises(k8s.DiscoveryError, match="after 3 lookups .*list no other pod yet"):
        k8s.discover_with_retries(config(), attempts=3, pause=0.0, hostname="doq-1",
                                  resolver=cluster_dns.resolver, sleep=lambda _: None)
    assert len(cluster_dns.zone.queries) == 3


def test_bootstrapper_needs_nobody(cluster_dns: FakeDns) -> None:
    found = k8s.discover_with_retries(config(), attempts=5, pause=10.0, hostname="doq-0",
                                      resolver=cluster_dns.resolver)
    assert found == k8s.Discovery(f"{pod(0)}:8000", f"{pod(0)}:9000", [], True)
    assert len(cluster_dns.zone.queries) == 1


def test_with_discovery_sets_id_raft_address_and_join_target() -> None:
    joiner = k8s.Discovery(f"{pod(1)}:8000", f"{pod(1)}:9000", [f"{pod(0)}:8000"], False)
    cfg = k8s.with_discovery(config(), joiner)
    assert (cfg.cluster.node_id, cfg.raft.address, cfg.cluster.join_addr) == (
        f"{pod(1)}:8000", f"{pod(1)}:9000", f"{pod(0)}:8000")
    assert cfg.validate() == []
    bootstrapper = k8s.Discovery(f"{pod(0)}:8000", f"{pod(0)}:9000", [f"{pod(1)}:8000"], True)
    assert k8s.with_discovery(config(), bootstrapper).cluster.join_addr == ""


# -- a real HTTP server standing in for the Kubernetes API --------------------------------
_SLICE_PATH = re.compile(
    r"/apis/discovery\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/endpointslices(?:/(?P<name>[^/]+))?")


@dataclass
class Call:
    method: str
    path: str
    authorization: str
    body: Any


@dataclass
class ApiState:
    slices: dict[tuple[str, str], Any] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    fail_next: int = 0                                   # answer 500 to this many requests
    lock: threading.Lock = field(default_factory=threading.Lock)


class ApiHandler(BaseHTTPRequestHandler):
    state: ApiState                                      # set per server (subclass)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_DELETE(self) -> None:
        self._handle(self._delete)

    def do_POST(self) -> None:
        self._handle(self._create)

    def _handle(self, action: Any) -> None:
        match = _SLICE_PATH.fullmatch(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        with self.state.lock:
            self.state.calls.append(Call(self.command, self.path,
                                         self.headers.get("Authorization", ""), body))
            if self.state.fail_next or match is None:
                self.state.fail_next = max(0, self.state.fail_next - 1)
                return self._answer(500 if match else 404, "internal error")
            action(match["ns"], match["name"], body)

    def _delete(self, ns: str, name: str | None, _: Any) -> None:
        if self.state.slices.pop((ns, name or ""), None) is None:
            return self._answer(404, f'endpointslices "{name}" not found')
        self._answer(200, "deleted")

    def _create(self, ns: str, name: str | None, body: Any) -> None:
        key = (ns, body["metadata"]["name"])
        if name is not None or key in self.state.slices:
            return self._answer(409, "already exists")
        self.state.slices[key] = body
        self._answer(201, "created")

    def _answer(self, status: int, message: str) -> None:
        raw = json.dumps({"kind": "Status", "code": status, "message": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@dataclass
class FakeApi:
    state: ApiState
    url: str


@contextlib.contextmanager
def serve_api(tls: ssl.SSLContext | None = None) -> Iterator[FakeApi]:
    """The fake Kubernetes API on 127.0.0.1 (HTTPS with ``tls``) for the block."""
    state = ApiState()
    handler = type("BoundApiHandler", (ApiHandler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    scheme = "https" if tls else "http"
    with serving(server):
        yield FakeApi(state, f"{scheme}://127.0.0.1:{server.server_address[1]}")


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with serve_api() as fake:
        yield fake


def leader(url: str, ip: str = "10.0.0.5", hostname: str = "doq-1") -> k8s.EndpointSliceLeader:
    return k8s.EndpointSliceLeader(url, "secret-token", None, NAMESPACE, "doq", ip, hostname,
                                   8000, timeout=2.0)


COLLECTION = "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices"
EXPECTED_SLICE = {
    "apiVersion": "discovery.k8s.io/v1",
    "kind": "EndpointSlice",
    "metadata": {"name": "doq", "namespace": "ns",
                 "labels": {"kubernetes.io/service-name": "doq"}},
    "addressType": "IPv4",
    "endpoints": [{"addresses": ["10.0.0.5"], "conditions": {"ready": True},
                   "hostname": "doq-1"}],
    "ports": [{"name": "http", "port": 8000}],
}


def test_mark_leader_deletes_then_creates_the_slice(api: FakeApi) -> None:
    api.state.slices[(NAMESPACE, "doq")] = {"stale": True}
    leader(api.url).mark_leader()
    assert [(c.method, c.path, c.authorization) for c in api.state.calls] == [
        ("DELETE", f"{COLLECTION}/doq", "Bearer secret-token"),
        ("POST", COLLECTION, "Bearer secret-token")]
    assert api.state.calls[1].body == EXPECTED_SLICE
    assert api.state.slices == {(NAMESPACE, "doq"): EXPECTED_SLICE}


def test_missing_slice_is_fine(api: FakeApi) -> None:
    leader(api.url).mark_leader()                        # DELETE answers 404
    assert api.state.slices == {(NAMESPACE, "doq"): EXPECTED_SLICE}


def test_leadership_changes_leave_one_slice_for_the_latest_leader(api: FakeApi) -> None:
    first, second = leader(api.url), leader(api.url, "10.0.0.6", "doq-2")
    for node in (first, second, first, second):
        node.mark_leader()
    assert list(api.state.slices) == [(NAMESPACE, "doq")]
    endpoint = api.state.slices[(NAMESPACE, "doq")]["endpoints"]
    assert endpoint == [{"addresses": ["10.0.0.6"], "conditions": {"ready": True},
                         "hostname": "doq-2"}]


def test_failing_delete_is_ignored(api: FakeApi) -> None:
    api.state.fail_next = 1
    leader(api.url).mark_leader()
    assert api.state.slices == {(NAMESPACE, "doq"): EXPECTED_SLICE}


def test_failing_api_raises_a_clear_error(api: FakeApi) -> None:
    api.state.fail_next = 2
    with pytest.raises(k8s.EndpointSliceError, match="HTTP 500 internal error"):
        leader(api.url).mark_leader()
    assert api.state.slices == {}


def test_unreachable_api_raises_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_ports(1)[0]}"
    with pytest.raises(k8s.EndpointSliceError, match="failed: POST"):
        leader(url).mark_leader()


def test_mark_leader_while_retries_until_done(api: FakeApi) -> None:
    api.state.fail_next = 4                              # two failed rounds
    pauses: list[float] = []
    assert leader(api.url).mark_leader_while(lambda: True, pause=0.5, sleep=pauses.append)
    assert pauses == [0.5, 0.5]
    assert api.state.slices == {(NAMESPACE, "doq"): EXPECTED_SLICE}


def test_mark_leader_while_stops_when_leadership_is_lost(api: FakeApi) -> None:
    api.state.fail_next = 1000
    leading = iter([True, True, False])
    assert not leader(api.url).mark_leader_while(lambda: next(leading), sleep=lambda _: None)
    assert len(api.state.calls) == 4                     # two rounds of DELETE + POST


# -- in-cluster configuration over TLS -----------------------------------------------------
def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str,
                 signer: ec.EllipticCurvePrivateKey, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    usage = dict.fromkeys(["content_commitment", "key_encipherment", "data_encipherment",
                           "key_agreement", "encipher_only", "decipher_only"], False)
    builder = (x509.CertificateBuilder()
               .subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=not ca, key_cert_sign=ca,
                                            crl_sign=ca, **usage), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                              critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   signer.public_key()), critical=False))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_tls_files(folder: Path) -> ssl.SSLContext:
    """A CA (``ca.crt``, as Kubernetes mounts it) and a server context signed by it."""
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    ca_cert = _certificate("test-ca", ca_key, "test-ca", ca_key, ca=True)
    server_cert = _certificate("kubernetes", server_key, "test-ca", ca_key, ca=False)
    (folder / "ca.crt").write_bytes(_pem(ca_cert))
    (folder / "server.pem").write_bytes(_pem(server_cert) + server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "server.pem")
    return context


def test_from_environment_uses_the_service_account_over_tls(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("rotating-token\n")
    with serve_api(write_tls_files(tmp_path)) as fake:
        environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                   "KUBERNETES_SERVICE_PORT": fake.url.rsplit(":", 1)[1]}
        node = k8s.EndpointSliceLeader.from_environment(
            config(), hostname="localhost", environ=environ, account_dir=str(tmp_path))
        node.mark_leader()
        (tmp_path / "token").write_text("rotated-token\n")
        node.mark_leader()
    assert [c.authorization for c in fake.state.calls] == ["Bearer rotating-token"] * 2 + [
        "Bearer rotated-token"] * 2
    endpoint = fake.state.slices[(NAMESPACE, "doq")]["endpoints"][0]
    assert endpoint == {"addresses": ["127.0.0.1"], "conditions": {"ready": True},
                        "hostname": "localhost"}


def test_from_environment_outside_a_pod_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    with pytest.raises(k8s.DiscoveryError, match="KUBERNETES_SERVICE_HOST"):
        k8s.EndpointSliceLeader.from_environment(config(), "doq-0", {}, str(tmp_path))
    with pytest.raises(k8s.DiscoveryError, match="service-account token"):
        k8s.EndpointSliceLeader.from_environment(
            config(), "doq-0", {"KUBERNETES_SERVICE_HOST": "127.0.0.1"}, str(tmp_path / "no"))


def test_untrusted_api_server_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    write_tls_files(other)                               # a different CA
    with serve_api(write_tls_files(tmp_path)) as fake:
        node = k8s.EndpointSliceLeader(fake.url, "t", str(other / "ca.crt"), NAMESPACE, "doq",
                                       "10.0.0.5", "doq-1", 8000, timeout=2.0)
        with pytest.raises(k8s.EndpointSliceError, match="CERTIFICATE_VERIFY_FAILED"):
            node.mark_leader()
    assert fake.state.calls == []


def test_the_slice_carries_the_client_services_ports(tmp_path: Path) -> None:
    """gRPC through the client Service needs a 'grpc' port in the leader's slice, named and
    numbered as the Service's targetPort (deploy/service.yaml)."""
    (tmp_path / "token").write_text("t\n")
    cfg = replace(config(), grpc=GrpcConfig(address="0.0.0.0:10000"))
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    node = k8s.EndpointSliceLeader.from_environment(cfg, hostname="localhost", environ=environ,
                                                    account_dir=str(tmp_path))
    ports = node.slice_body()["ports"]
    assert ports == [{"name": "http", "port": 8000}, {"name": "grpc", "port": 10000}]
    with open(Path(REPO) / "deploy" / "service.yaml", encoding="utf-8") as f:
        service = yaml.safe_load(f)
    assert {(p["name"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        (p["name"], p["port"]) for p in ports}
    without = k8s.EndpointSliceLeader.from_environment(
        config(), hostname="localhost", environ=environ, account_dir=str(tmp_path))
    assert without.slice_body()["ports"] == [{"name": "http", "port": 8000}]
