"""Node configuration (layer L0; SPEC §9).

One frozen dataclass per section; every field carries its default and a one-line
description (``field.metadata["doc"]``, also the CLI help text). The dotted key of a
field is ``<section>.<field>``, unless the field sets ``metadata["key"]`` (e.g.
``queue.stats.window_side``). :data:`KEYS` is derived from the dataclasses, so adding
a field adds its flag, environment variables and file key.

Precedence, highest first: command-line flag explicitly given, environment variable,
config file, dataclass default. :func:`load_config` merges them, converts the raw
values (collecting every type error), runs :meth:`Config.validate` and raises
:class:`ConfigError` with every problem at once. Unknown keys in the file are not an
error: they end up in :attr:`Config.warnings` (not compared in equality).

The configuration is passed down explicitly; nothing here is global state.
"""
from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar, get_origin, get_type_hints

import yaml

from doq_lib.auth import KeysFileError, read_keys_file
from doq_lib.secret import MIN_LENGTH, SecretError, is_loopback_host, read_passphrase

T = TypeVar("T")

CONFIG_FILE_NAMES = ("config.yaml", "config.yml", "config.json")
ENV_PREFIX = "DOQ_"
GRPC_SERVING = ("thread", "gevent")
LOG_MODES = ("console", "stackdriver")
LOG_LEVELS = ("trace", "debug", "info", "warn", "warning", "error", "fatal", "panic")


def _setting(default: T, doc: str, *, key: str | None = None) -> T:
    """A dataclass field with its default, its description and optional key suffix."""
    metadata = {"doc": doc} if key is None else {"doc": doc, "key": key}
    return field(default=default, metadata=metadata)


_IGNORED = "accepted for compatibility, ignored"


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
    cors_origins: tuple[str, ...] = _setting(
        (), "comma-separated origins whose pages may call the API (CORS); empty = none")
    tls_cert: str = _setting("", "PEM certificate (chain) for HTTPS; empty = plain HTTP")
    tls_key: str = _setting("", "PEM private key of http.tls_cert")
    tls_client_ca: str = _setting(
        "", "PEM CA certificates: HTTPS clients must present a certificate they signed "
        "(mutual TLS); empty = no client certificates")


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
    tls_cert: str = _setting("", "PEM certificate (chain) for gRPC over TLS; empty = plain")
    tls_key: str = _setting("", "PEM private key of grpc.tls_cert")
    tls_client_ca: str = _setting(
        "", "PEM CA certificates: gRPC clients must present a certificate they signed "
        "(mutual TLS); empty = no client certificates")
    serving: str = _setting(
        "thread", "how gRPC is served: 'thread' (grpc.aio on its own OS thread, calls handed "
        "to the event loop) or 'gevent' (grpcio in gevent mode, every completion through "
        "the hub's thread pool)")


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
    compression: str = _setting("", f"none, snappy or zstd ({_IGNORED})")
    zstd_compression_level: int = _setting(0, _IGNORED)
    block_cache_size: int = _setting(0, f"bytes ({_IGNORED})")
    index_cache_size: int = _setting(0, f"bytes ({_IGNORED})")
    base_table_size: int = _setting(0, f"bytes ({_IGNORED})")
    base_level_size: int = _setting(0, f"bytes ({_IGNORED})")
    num_compactors: int = _setting(0, _IGNORED)
    num_level_zero_tables: int = _setting(0, _IGNORED)
    num_level_zero_tables_stall: int = _setting(0, _IGNORED)
    num_memtables: int = _setting(0, _IGNORED)
    value_log_file_size: int = _setting(0, f"bytes ({_IGNORED})")
    fsync_store: bool = _setting(
        False, "fsync every store commit (the Raft journal already makes writes durable)")
    map_size: int = _setting(1 << 36, "LMDB map size, bytes")
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
        return [problem for check in _CHECKS for problem in check(self)]


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
_PREFIXES = frozenset(
    key.rsplit(".", depth)[0] for key in KEYS for depth in range(1, key.count(".") + 1))


def env_names(key: str) -> tuple[str, str]:
    """The two environment variables of a key, dotted form first (it wins)."""
    upper = key.upper()
    return upper, ENV_PREFIX + upper.replace(".", "_")


# --- addresses --------------------------------------------------------------------

_HOST_RE = re.compile(r"[A-Za-z0-9._%-]*")
_BRACKETED_IPV6_RE = re.compile(r"\[[0-9A-Za-z:.%]+\]")


def _is_host(text: str) -> bool:
    """A name, an IPv4 address or a bracketed IPv6 address (empty allowed)."""
    return bool(_HOST_RE.fullmatch(text) or _BRACKETED_IPV6_RE.fullmatch(text))


def split_host_port(address: str) -> tuple[str, int]:
    """Split ``host:port`` (IPv6 host in brackets); ValueError if malformed.

    The host may be empty (``:9000``) and is returned without brackets; the port
    must be 0-65535.
    """
    host, sep, port = address.rpartition(":")
    if not (sep and _is_host(host) and _is_port_text(port)):
        raise ValueError(f"not host:port: {address!r}")
    return host.strip("[]"), int(port)


def _is_port_text(text: str) -> bool:
    return text.isascii() and text.isdigit() and int(text) <= 65535


def _is_address(value: str, *, host_required: bool = True, port_zero: bool = True) -> bool:
    try:
        host, port = split_host_port(value)
    except ValueError:
        return False
    return (bool(host) or not host_required) and (port > 0 or port_zero)


# --- validation -------------------------------------------------------------------

_Rule = tuple[Callable[[Any], bool], str]


def _is_dir_name(value: str) -> bool:
    return value not in ("", ".", "..") and not any(c in value for c in "/\\\0")


_POSITIVE: _Rule = (lambda v: v > 0, "expected a number > 0")
_NON_NEGATIVE: _Rule = (lambda v: v >= 0, "expected a number >= 0")
_AT_LEAST_ONE: _Rule = (lambda v: v >= 1, "expected an integer >= 1")
_PORT: _Rule = (lambda v: 0 <= v <= 65535, "expected a port number 0-65535")
_BIND: _Rule = (lambda v: v == "" or _is_address(v, host_required=False),
                "expected host:port or empty")

#: Single-value rules: dotted key -> (predicate, what was expected).
_RULES: Mapping[str, _Rule] = {
    "profiling.port": _PORT,
    "logging.mode": (lambda v: v in LOG_MODES, f"expected one of {', '.join(LOG_MODES)}"),
    "logging.level": (lambda v: v.lower() in LOG_LEVELS,
                      f"expected one of {', '.join(LOG_LEVELS)}"),
    "http.port": _PORT,
    "http.host": (lambda v: _is_host(v) or _is_host(f"[{v}]"),
                  "expected a host name or IP address"),
    "grpc.address": _BIND,
    "grpc.serving": (lambda v: v in GRPC_SERVING, f"expected one of {', '.join(GRPC_SERVING)}"),
    "raft.apply_timeout": _POSITIVE,
    "raft.bind_address": _BIND,
    "raft.tick_period": _POSITIVE,
    "raft.append_entries_period": _POSITIVE,
    "raft.election_timeout_min": _POSITIVE,
    "raft.election_timeout_max": _POSITIVE,
    "raft.leader_fallback_timeout": _POSITIVE,
    "raft.connection_retry_time": _POSITIVE,
    "raft.max_batch_bytes": _AT_LEAST_ONE,
    "raft.max_inflight": _AT_LEAST_ONE,
    "raft.snapshot_min_entries": _AT_LEAST_ONE,
    "raft.snapshot_max_log_bytes": _AT_LEAST_ONE,
    "raft.snapshot_min_interval": _NON_NEGATIVE,
    "storage.data_dir": (bool, "expected a non-empty path"),
    "storage.gc_interval": _AT_LEAST_ONE,
    "storage.gc_discard_ratio": (lambda v: 0 < v < 1, "expected a number between 0 and 1"),
    "storage.map_size": _AT_LEAST_ONE,
    "storage.history_seconds": (lambda v: v >= 60, "expected at least 60"),
    "cluster.namespace": (bool, "expected a non-empty name"),
    "cluster.node_id": (_is_dir_name, "expected a name usable as a directory name"),
    "cluster.join_addr": (lambda v: v == "" or _is_address(v, port_zero=False),
                          "expected host:port or empty"),
    "queue.acknowledgement_check_interval": _AT_LEAST_ONE,
    "queue.default_acknowledgement_timeout": _AT_LEAST_ONE,
    "queue.stats.window_side": _AT_LEAST_ONE,
} | {
    f"storage.{name}": _NON_NEGATIVE
    for name in ("zstd_compression_level", "block_cache_size", "index_cache_size",
                 "base_table_size", "base_level_size", "num_compactors",
                 "num_level_zero_tables", "num_level_zero_tables_stall",
                 "num_memtables", "value_log_file_size")
}


def _rule_problems(cfg: Config) -> list[str]:
    problems: list[str] = []
    for key, (ok, expected) in _RULES.items():
        value = cfg.value(key)
        if not ok(value):
            problems.append(f"{key}: {expected}, got {value!r}")
    return problems


def _raft_address_problems(cfg: Config) -> list[str]:
    """Kubernetes mode (SPEC §7.4) replaces the host, so a bare port is fine there."""
    address = cfg.raft.address
    if cfg.cluster.service_name and (_is_port_text(address) or _is_address(
            address, host_required=False)):
        return []
    if _is_address(address):
        return []
    return [f"raft.address: expected host:port, got {address!r}"]


def _peer_problems(cfg: Config) -> list[str]:
    peers = cfg.cluster.peers
    problems = [f"cluster.peers: expected host:port, got {peer!r}"
                for peer in peers if not _is_address(peer, port_zero=False)]
    duplicates = sorted({peer for peer in peers if peers.count(peer) > 1})
    return problems + [f"cluster.peers: {peer!r} is listed more than once"
                       for peer in duplicates]


def _raft_timing_problems(cfg: Config) -> list[str]:
    raft = cfg.raft
    checks = (
        (raft.election_timeout_min < raft.election_timeout_max,
         "raft.election_timeout_min: must be less than raft.election_timeout_max "
         f"({raft.election_timeout_min!r} >= {raft.election_timeout_max!r})"),
        (raft.append_entries_period * 3 < raft.election_timeout_min,
         "raft.append_entries_period: three periods must fit in "
         f"raft.election_timeout_min ({raft.append_entries_period!r} * 3 >= "
         f"{raft.election_timeout_min!r})"),
        (raft.leader_fallback_timeout > raft.append_entries_period,
         "raft.leader_fallback_timeout: must be greater than "
         f"raft.append_entries_period ({raft.leader_fallback_timeout!r} <= "
         f"{raft.append_entries_period!r})"),
    )
    return [message for ok, message in checks if not ok]


def raft_bind_host(cfg: Config) -> str:
    """The host the Raft listener binds (empty: every interface)."""
    address = cfg.raft.bind_address or cfg.raft.address
    host, _, _ = address.rpartition(":")
    return host.strip("[]")


def _secret_problems(cfg: Config) -> list[str]:
    """A Raft port reachable from other machines needs the cluster secret (issue 12)."""
    raft = cfg.raft
    if raft.password and raft.password_file:
        return ["raft.password_file: give the cluster secret either as raft.password or in "
                "raft.password_file, not both"]
    try:
        passphrase = read_passphrase(raft.password, raft.password_file)
    except SecretError as exc:
        return [str(exc)]
    if passphrase and len(passphrase) < MIN_LENGTH:
        key = "raft.password" if raft.password else "raft.password_file"
        return [f"{key}: the cluster secret must have at least {MIN_LENGTH} "
                "characters (for example the output of 'openssl rand -hex 32')"]
    if passphrase:
        return []
    if cfg.cluster.service_name:
        return ["raft.password: Kubernetes mode (cluster.service_name) runs Raft on the pod "
                "network, and it must not run there without a cluster secret; set it "
                "(raft.password, DOQ_RAFT_PASSWORD or raft.password_file) to the same value "
                "on every node"]
    address = raft.bind_address or raft.address
    if not _is_address(address, host_required=False):
        return []                                   # reported by the address checks
    host = raft_bind_host(cfg)
    if not is_loopback_host(host):
        where = host or "every interface"
        return [f"raft.address: Raft would listen on {where}, reachable from other machines, "
                "without a cluster secret; set raft.password (or DOQ_RAFT_PASSWORD, or "
                "raft.password_file) to the same secret on every node, or bind Raft to a "
                "loopback address"]
    return []


def _auth_problems(cfg: Config) -> list[str]:
    if not cfg.auth.keys_file:
        return []
    try:
        read_keys_file(cfg.auth.keys_file)
    except KeysFileError as exc:
        return [f"auth.keys_file: {line}" for line in str(exc).splitlines()]
    return []


def _tls_problems(cfg: Config) -> list[str]:
    problems: list[str] = []
    for section in ("http", "grpc"):
        cert, key, client_ca = (cfg.value(f"{section}.{n}")
                                for n in ("tls_cert", "tls_key", "tls_client_ca"))
        if bool(cert) != bool(key):
            problems.append(f"{section}.tls_key: give both {section}.tls_cert and "
                            f"{section}.tls_key, or neither")
        if client_ca and not cert:
            problems.append(f"{section}.tls_client_ca: mutual TLS needs {section}.tls_cert "
                            f"and {section}.tls_key")
        for name, path in (("tls_cert", cert), ("tls_key", key), ("tls_client_ca", client_ca)):
            if path and not os.path.isfile(path):
                problems.append(f"{section}.{name}: file not found: {path}")
    if cfg.cluster.tls_ca and not os.path.isfile(cfg.cluster.tls_ca):
        problems.append(f"cluster.tls_ca: file not found: {cfg.cluster.tls_ca}")
    return problems


_ORIGIN_RE = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+")


def _cors_problems(cfg: Config) -> list[str]:
    return [f"http.cors_origins: expected scheme://host[:port] or *, got {origin!r}"
            for origin in cfg.http.cors_origins
            if origin != "*" and not _ORIGIN_RE.fullmatch(origin)]


_CHECKS: tuple[Callable[[Config], list[str]], ...] = (
    _rule_problems, _raft_address_problems, _peer_problems, _raft_timing_problems,
    _secret_problems, _auth_problems, _cors_problems, _tls_problems)


# --- raw value conversion ---------------------------------------------------------

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


def _to_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError("expected true/false, 1/0 or yes/no")


def _to_int(value: object) -> int:
    try:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            return int(value.strip(), 10)
    except ValueError:
        pass
    raise ValueError("expected an integer")


def _to_float(value: object) -> float:
    try:
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            number = float(value)
            if math.isfinite(number):
                return number
    except ValueError:
        pass
    raise ValueError("expected a number")


def _to_str(value: object) -> str:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError("expected a string")


def _to_tuple(value: object) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise ValueError("expected a comma-separated list")
    return tuple(item.strip() for item in items if item.strip())


_PARSERS: Mapping[type, Callable[[object], Any]] = {
    bool: _to_bool, int: _to_int, float: _to_float, str: _to_str, tuple: _to_tuple,
}


class _Raw(NamedTuple):
    """A value as given, and where it came from (for messages)."""

    value: object
    origin: str


def _convert(raw: Mapping[str, _Raw]) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, (value, origin) in raw.items():
        if key not in KEYS:
            problems.append(f"{key}: unknown configuration key (from {origin})")
            continue
        try:
            values[key] = _PARSERS[KEYS[key].type](value)
        except ValueError as exc:
            problems.append(f"{key}: {exc}, got {value!r} (from {origin})")
    return values, problems


def _build(values: Mapping[str, Any], warnings: list[str]) -> Config:
    changes: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        spec = KEYS[key]
        changes.setdefault(spec.section, {})[spec.name] = value
    default = Config()
    sections = {name: replace(getattr(default, name), **given)
                for name, given in changes.items()}
    return replace(default, **sections, warnings=tuple(warnings))


# --- sources ----------------------------------------------------------------------

def _from_flags(flags: Mapping[str, str | None]) -> dict[str, _Raw]:
    return {key: _Raw(value, f"--{key}") for key, value in flags.items()
            if value is not None}


def _from_env(env: Mapping[str, str]) -> dict[str, _Raw]:
    """Dotted names win over ``DOQ_`` names; empty variables count as unset."""
    raw: dict[str, _Raw] = {}
    for key in KEYS:
        for name in env_names(key):
            if env.get(name):
                raw[key] = _Raw(env[name], f"environment {name}")
                break
    return raw


def _find_file(config_path: str | None, cwd: str) -> str | None:
    if config_path:
        if not os.path.isfile(os.path.join(cwd, config_path)):
            raise ConfigError([f"config: file not found: {config_path}"])
        return config_path
    return next((name for name in CONFIG_FILE_NAMES
                 if os.path.isfile(os.path.join(cwd, name))), None)


def _read_yaml(name: str, cwd: str) -> Mapping[Any, Any]:
    try:
        with open(os.path.join(cwd, name), encoding="utf-8") as stream:
            document = yaml.safe_load(stream)
    except OSError as exc:
        raise ConfigError([f"config: cannot read {name}: {exc.strerror}"]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([f"config: {name} is not valid YAML/JSON: {exc}"]) from exc
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ConfigError([f"config: {name} must contain a mapping of keys"])
    return document


def _unknown(name: str, key: str) -> str:
    close = difflib.get_close_matches(key, KEYS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{name}: unknown key {key!r} ignored{hint}"


def _flatten(node: Mapping[Any, Any], prefix: str, name: str,
             out: dict[str, _Raw], warnings: list[str]) -> None:
    """Collect known keys of a nested (or flat dotted) document into ``out``."""
    for raw_key, value in node.items():
        key = prefix + str(raw_key).lower()
        if key in KEYS and value is None:
            warnings.append(f"{name}: key {key!r} has no value; ignored")
        elif key in KEYS:
            if key in out:
                warnings.append(f"{name}: key {key!r} given more than once; last one wins")
            out[key] = _Raw(value, name)
        elif key in _PREFIXES and isinstance(value, Mapping):
            _flatten(value, key + ".", name, out, warnings)
        else:
            warnings.append(_unknown(name, key))


def _from_file(config_path: str | None, cwd: str) -> tuple[dict[str, _Raw], list[str]]:
    name = _find_file(config_path, cwd)
    raw: dict[str, _Raw] = {}
    warnings: list[str] = []
    if name is not None:
        _flatten(_read_yaml(name, cwd), "", name, raw, warnings)
    return raw, warnings


def load_config(flags: Mapping[str, str | None], env: Mapping[str, str],
                config_path: str | None, cwd: str) -> Config:
    """Merge flags > environment > file > defaults into a validated :class:`Config`.

    ``flags`` maps dotted keys to the raw values of the flags explicitly given (None
    or absent = not given). ``config_path`` (relative to ``cwd``) must exist when
    given; otherwise the first of :data:`CONFIG_FILE_NAMES` in ``cwd`` is read, if
    any. Raises :class:`ConfigError` listing every type error, else every
    validation problem. Unknown file keys are reported in ``Config.warnings``.
    """
    file_raw, warnings = _from_file(config_path, cwd)
    values, problems = _convert({**file_raw, **_from_env(env), **_from_flags(flags)})
    if problems:
        raise ConfigError(problems)
    cfg = _build(values, warnings)
    problems = cfg.validate()
    if problems:
        raise ConfigError(problems)
    return cfg
