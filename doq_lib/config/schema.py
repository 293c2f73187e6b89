"""The configuration's schema: one frozen dataclass per section, :class:`Config`, and the
dotted keys derived from them (:data:`KEYS`, :data:`KEY_DOCS`).
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar, get_origin, get_type_hints

from doq_lib.config.checks import CHECKS

T = TypeVar("T")


def _setting(default: T, doc: str, *, key: str | None = None) -> T:
    """A dataclass field with its default, its description and optional key suffix."""
    metadata = {"doc": doc} if key is None else {"doc": doc, "key": key}
    return field(default=default, metadata=metadata)


IGNORED = "accepted for compatibility, ignored"


@dataclass(frozen=True)
class ProfilingConfig:
    """``profiling.*``: pprof-style profiling listener."""

    enabled: bool = _setting(False, "expose the profiling listener")
    port: int = _setting(6060, "profiling listener port (all interfaces)")


@dataclass(frozen=True)
class PrometheusConfig:
    """``prometheus.*``: metrics."""

    enabled: bool = _setting(False, "register metrics and serve /metrics (true/false)")


@dataclass(frozen=True)
class LoggingConfig:
    """``logging.*``: log format and threshold (``warning`` means ``warn``)."""

    mode: str = _setting("console", "console (stderr) or stackdriver (JSON on stdout)")
    level: str = _setting("warning", "trace, debug, info, warn(ing), error, fatal or panic")


@dataclass(frozen=True)
class HttpConfig:
    """``http.*``: REST API, admin UI and metrics listener."""

    port: int = _setting(8000, "HTTP listen port (0 = ephemeral)")
    host: str = _setting("", "HTTP bind address (empty = all interfaces)")
    advertise: str = _setting(
        "", "host:port that clients should use for this node's HTTP API, as the cluster "
        "lists it (a published port: docker, a load balancer); empty = the address the nodes "
        "use between themselves (raft.address's host, the bound port)")
    cors_origins: tuple[str, ...] = _setting(
        (), "comma-separated origins whose pages may call the API (CORS); empty = none")
    tls_cert: str = _setting("", "PEM certificate (chain) for HTTPS; empty = plain HTTP")
    tls_key: str = _setting("", "PEM private key of http.tls_cert")
    tls_client_ca: str = _setting(
        "", "PEM CA certificates: HTTPS clients must present a certificate they signed "
        "(mutual TLS); empty = no client certificates")
    header_timeout: float = _setting(
        10.0, "seconds a request's line and headers may take from their first byte, and a "
        "new connection may wait before its first request's first byte (408 and close "
        "after; closed quietly when nothing came)")
    body_timeout: float = _setting(
        30.0, "seconds a request body may pause between bytes (408 and close after)")
    request_timeout: float = _setting(
        60.0, "seconds a whole request (line, headers, body) may take from its first byte, "
        "plus one second per http.min_body_rate bytes of body received (408 and close "
        "after): a client trickling a request cannot hold a connection")
    min_body_rate: int = _setting(
        8192, "bytes per second a body must average to get more time than "
        "http.request_timeout (large uploads: a restore)")
    idle_timeout: float = _setting(
        120.0, "seconds a kept-alive connection may wait for its next request (then closed)")
    max_connections: int = _setting(
        10000, "open HTTP connections at most; one more is answered 503 and closed")
    max_held_bytes: int = _setting(
        256 << 20, "request body bytes the node holds at most for requests not yet answered, "
        "all connections together (each request counts up to the 1 MiB a body may have); "
        "the request whose body would pass it is answered 503 and its connection closed")


@dataclass(frozen=True)
class AuthConfig:
    """``auth.*``: API keys."""

    keys_file: str = _setting(
        "", "YAML file of API keys with roles (doq keys); empty = no authentication, and "
        "restore, join, leave and /internal/* only from loopback clients")


@dataclass(frozen=True)
class GrpcConfig:
    """``grpc.*``: gRPC listener."""

    address: str = _setting("", "gRPC bind host:port (empty = no gRPC server)")
    advertise: str = _setting(
        "", "host:port that clients should use for this node's gRPC API, as the cluster "
        "lists it; empty = the address the nodes use between themselves")
    tls_cert: str = _setting("", "PEM certificate (chain) for gRPC over TLS; empty = plain")
    tls_key: str = _setting("", "PEM private key of grpc.tls_cert")
    tls_client_ca: str = _setting(
        "", "PEM CA certificates: gRPC clients must present a certificate they signed "
        "(mutual TLS); empty = no client certificates")
    serving: str = _setting(
        "hub", "how gRPC is served: 'hub' only (HTTP/2 by the h2 library in the event loop); "
        "the earlier 'thread' and 'gevent' modes are gone")
    max_connections: int = _setting(
        10000, "open gRPC connections at most; one more answers its calls "
        "RESOURCE_EXHAUSTED and is closed")
    max_held_bytes: int = _setting(
        256 << 20, "request bytes the node holds for gRPC calls at most: "
        "received for unary calls not yet answered or for streams not yet read, all "
        "connections together, one connection at most 32 MiB of it; the call that would "
        "pass it ends RESOURCE_EXHAUSTED")


@dataclass(frozen=True)
class RaftConfig:
    """``raft.*``: replication. Durations are in seconds."""

    address: str = _setting("localhost:9000", "Raft host:port, bound and advertised")
    apply_timeout: float = _setting(5.0, "seconds to wait for a proposal to commit")
    bind_address: str = _setting("", "Raft bind host:port (empty = raft.address)")
    password: str = _setting(
        "", "cluster secret shared by all members (at least 16 characters): authenticates "
        "and encrypts Raft traffic, signs backups and requests between nodes")
    password_file: str = _setting(
        "", "file whose first line is the cluster secret (instead of raft.password)")
    tick_period: float = _setting(
        0.25, "longest sleep of the Raft tick with nothing to do (it wakes on every message, "
        "proposal and sync, and for each heartbeat or election deadline)")
    append_entries_period: float = _setting(0.1, "seconds between leader heartbeats")
    election_timeout_min: float = _setting(0.6, "minimum election timeout, seconds")
    election_timeout_max: float = _setting(1.4, "maximum election timeout, seconds")
    leader_fallback_timeout: float = _setting(
        2.0, "seconds a leader keeps leading without a majority")
    connection_retry_time: float = _setting(0.5, "seconds between reconnects to peers")
    max_batch_bytes: int = _setting(1048576, "group-commit cap, bytes per Raft entry")
    max_inflight: int = _setting(4, "Raft entries in flight (group commit)")
    pipeline_entries: int = _setting(
        1, "uncommitted entries the leader has out at once: calls arriving meanwhile wait "
        "and go into the next entry together (1: the fewest, largest entries, the least work "
        "per message; more: lower latency where the network, not the CPU, is the limit)")
    snapshot_min_entries: int = _setting(50000, "log entries that trigger a snapshot")
    snapshot_max_log_bytes: int = _setting(
        256 << 20, "log bytes that trigger a snapshot (the log is held in memory)")
    snapshot_min_interval: float = _setting(
        300.0, "seconds after which a snapshot is taken even below snapshot_min_entries")
    fsync_in_thread: bool = _setting(
        True, "fsync the journal without stalling the event loop: through Linux native AIO "
        "where the kernel allows it, else in a worker thread (false: in the event loop)")
    apply_in_thread: bool = _setting(
        False, "apply committed entries in a writer thread (useful with storage.fsync_store)")


@dataclass(frozen=True)
class StorageConfig:
    """``storage.*``: data directory and storage tuning.

    The engine-tuning keys (compression ... value_log_file_size) belong to the
    reference's storage engine; they are accepted so command lines keep working and
    are ignored by this implementation.
    """

    data_dir: str = _setting("data", "root data directory (node data in data_dir/node_id)")
    gc_interval: int = _setting(300, "storage garbage-collection period, seconds")
    gc_discard_ratio: float = _setting(0.7, "storage garbage-collection threshold (0-1)")
    compression: str = _setting("", f"none, snappy or zstd ({IGNORED})")
    zstd_compression_level: int = _setting(0, IGNORED)
    block_cache_size: int = _setting(0, f"bytes ({IGNORED})")
    index_cache_size: int = _setting(0, f"bytes ({IGNORED})")
    base_table_size: int = _setting(0, f"bytes ({IGNORED})")
    base_level_size: int = _setting(0, f"bytes ({IGNORED})")
    num_compactors: int = _setting(0, IGNORED)
    num_level_zero_tables: int = _setting(0, IGNORED)
    num_level_zero_tables_stall: int = _setting(0, IGNORED)
    num_memtables: int = _setting(0, IGNORED)
    value_log_file_size: int = _setting(0, f"bytes ({IGNORED})")
    fsync_store: bool = _setting(
        False, "fsync every store commit (the Raft journal already makes writes durable)")
    map_size: int = _setting(1 << 36, "LMDB map size, bytes")
    min_free_bytes: int = _setting(
        64 << 20, "free disk space kept in reserve: below it, new messages are refused "
        "(507) while consuming and acknowledging go on")
    history_seconds: int = _setting(
        86400, "how long changes are remembered for incremental backups, seconds (at least 60)")


@dataclass(frozen=True)
class ClusterConfig:
    """``cluster.*``: membership. ``peers`` lists the Raft addresses of all voters."""

    namespace: str = _setting("default", "Kubernetes namespace")
    node_id: str = _setting("node-0", "Raft server id and data sub-directory name")
    service_name: str = _setting("", "Kubernetes service; enables discovery")
    join_addr: str = _setting("", "HTTP host:port of a running member to join")
    peers: tuple[str, ...] = _setting(
        (), "comma-separated Raft host:port of all voters (static cluster)")
    tls_ca: str = _setting(
        "", "PEM CA certificates that HTTPS requests to other nodes trust (with "
        "http.tls_cert; empty = the system's)")


@dataclass(frozen=True)
class QueueConfig:
    """``queue.*``: queue behaviour. Durations are whole seconds."""

    acknowledgement_check_interval: int = _setting(1, "seconds between redelivery scans")
    default_acknowledgement_timeout: int = _setting(
        1800, "ack timeout of queues created without one, seconds")
    stats_window_side: int = _setting(
        10, "rate window length, seconds", key="stats.window_side")


@dataclass(frozen=True)
class FaultsConfig:
    """``faults.*``: faults a node injects into itself, for the tests and the chaos harness
    only. Nothing is injected unless ``faults.enabled`` is true; each file takes effect
    while it exists (the clock's offset: the number of seconds written in it)."""

    enabled: bool = _setting(False, "tests only: inject the faults below, and let the state "
                             "machine take the operations that make it fail on purpose")
    clock_offset_file: str = _setting("", "tests only: the node's wall clock is moved by "
                                      "the seconds written in this file")
    fail_fsync_file: str = _setting("", "tests only: while this file exists, every journal "
                                    "sync fails")
    fail_write_file: str = _setting("", "tests only: while this file exists, every journal "
                                    "write fails with EIO")


@dataclass(frozen=True)
class Config:
    """The whole node configuration; ``Config()`` is the all-defaults one."""

    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    grpc: GrpcConfig = field(default_factory=GrpcConfig)
    raft: RaftConfig = field(default_factory=RaftConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    #: Non-fatal findings of :func:`load_config` (e.g. unknown file keys).
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def node_dir(self) -> str:
        """This node's data directory: ``<storage.data_dir>/<cluster.node_id>``."""
        return os.path.join(self.storage.data_dir, self.cluster.node_id)

    def value(self, key: str) -> Any:
        """The value of a dotted key, e.g. ``cfg.value("http.port")``."""
        spec = KEYS[key]
        return getattr(getattr(self, spec.section), spec.name)

    def validate(self) -> list[str]:
        """Every problem, one readable line each naming its dotted key; [] if none."""
        return [problem for check in CHECKS for problem in check(self)]


class ConfigError(Exception):
    """The configuration cannot be used; ``problems`` lists every reason."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class KeySpec(NamedTuple):
    """Where a dotted key lives: ``Config.<section>.<name>``, of runtime type ``type``."""

    section: str
    name: str
    type: type


def _key_specs() -> Iterator[tuple[str, KeySpec, str]]:
    for section, section_type in get_type_hints(Config).items():
        if not is_dataclass(section_type):
            continue
        hints = get_type_hints(section_type)
        for f in fields(section_type):
            key = f"{section}.{f.metadata.get('key', f.name)}"
            kind = get_origin(hints[f.name]) or hints[f.name]
            yield key, KeySpec(section, f.name, kind), f.metadata["doc"]


#: Dotted key -> (section attribute, field name, runtime type); sorted by key.
KEYS: Mapping[str, KeySpec] = MappingProxyType(
    {key: spec for key, spec, _ in sorted(_key_specs())})
#: Dotted key -> one-line description (the CLI help text); same order as KEYS.
KEY_DOCS: Mapping[str, str] = MappingProxyType(
    {key: doc for key, _, doc in sorted(_key_specs())})
#: Every proper dotted prefix of a key ("queue", "queue.stats", ...): file nesting.
KEY_PREFIXES = frozenset(
    key.rsplit(".", depth)[0] for key in KEYS for depth in range(1, key.count(".") + 1))

