"""Validation of a :class:`~doq_lib.config.schema.Config`: the single-value rules, the checks
across keys (``CHECKS``, run by ``Config.validate``) and the host:port helpers they use.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from doq_lib.auth import KeysFileError, read_keys_file
from doq_lib.secret import MIN_LENGTH, SecretError, is_loopback_host, read_passphrase

if TYPE_CHECKING:
    from doq_lib.config.schema import Config

GRPC_SERVING = ("hub",)
LOG_MODES = ("console", "stackdriver")
MIN_HELD_BYTES = 2 * (1 << 20) + 10     # grpc.max_held_bytes: two largest gRPC requests
LOG_LEVELS = ("trace", "debug", "info", "warn", "warning", "error", "fatal", "panic")


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

_ADVERTISE: _Rule = (lambda v: v == "" or (len(v) <= 255 and _is_address(v, port_zero=False)),
                     "expected host:port (a port 1-65535, at most 255 characters) or empty")

#: Single-value rules: dotted key -> (predicate, what was expected).
_RULES: Mapping[str, _Rule] = {
    "profiling.port": _PORT,
    "logging.mode": (lambda v: v in LOG_MODES, f"expected one of {', '.join(LOG_MODES)}"),
    "logging.level": (lambda v: v.lower() in LOG_LEVELS,
                      f"expected one of {', '.join(LOG_LEVELS)}"),
    "http.port": _PORT,
    "http.host": (lambda v: _is_host(v) or _is_host(f"[{v}]"),
                  "expected a host name or IP address"),
    "http.header_timeout": _POSITIVE,
    "http.body_timeout": _POSITIVE,
    "http.request_timeout": _POSITIVE,
    "http.min_body_rate": _AT_LEAST_ONE,
    "http.idle_timeout": _POSITIVE,
    "http.max_connections": _AT_LEAST_ONE,
    "http.max_held_bytes": (lambda v: v >= MIN_HELD_BYTES,
                            f"expected at least {MIN_HELD_BYTES} (two of the largest requests)"),
    "grpc.address": _BIND,
    "grpc.advertise": _ADVERTISE,
    "http.advertise": _ADVERTISE,
    "grpc.serving": (lambda v: v in GRPC_SERVING,
                     "expected hub: the thread and gevent modes are gone (the event loop serves "
                     "gRPC faster, docs/BENCHMARKS.md); leave the setting out"),
    "grpc.max_connections": _AT_LEAST_ONE,
    "grpc.max_held_bytes": (lambda v: v >= MIN_HELD_BYTES,
                            f"expected at least {MIN_HELD_BYTES} (two of the largest requests)"),
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
    "raft.pipeline_entries": _AT_LEAST_ONE,
    "raft.snapshot_min_entries": _AT_LEAST_ONE,
    "raft.snapshot_max_log_bytes": _AT_LEAST_ONE,
    "raft.snapshot_min_interval": _NON_NEGATIVE,
    "storage.data_dir": (bool, "expected a non-empty path"),
    "storage.gc_interval": _AT_LEAST_ONE,
    "storage.gc_discard_ratio": (lambda v: 0 < v < 1, "expected a number between 0 and 1"),
    "storage.map_size": _AT_LEAST_ONE,
    "storage.min_free_bytes": _NON_NEGATIVE,
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
    """A Raft port reachable from other machines needs the cluster secret."""
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


CHECKS: tuple[Callable[[Config], list[str]], ...] = (
    _rule_problems, _raft_address_problems, _peer_problems, _raft_timing_problems,
    _secret_problems, _auth_problems, _cors_problems, _tls_problems)
