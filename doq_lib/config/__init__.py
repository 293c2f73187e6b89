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

The package: ``schema`` (the dataclasses and keys), ``checks`` (validation and the host:port
helpers), ``load`` (the sources and :func:`load_config`); every public name is importable from
``doq_lib.config``.
"""
from __future__ import annotations

from doq_lib.config.checks import (
    GRPC_SERVING,
    LOG_LEVELS,
    LOG_MODES,
    raft_bind_host,
    split_host_port,
)
from doq_lib.config.load import CONFIG_FILE_NAMES, ENV_PREFIX, env_names, load_config
from doq_lib.config.schema import (
    IGNORED,
    KEY_DOCS,
    KEYS,
    AuthConfig,
    ClusterConfig,
    Config,
    ConfigError,
    FaultsConfig,
    GrpcConfig,
    HttpConfig,
    KeySpec,
    LoggingConfig,
    ProfilingConfig,
    PrometheusConfig,
    QueueConfig,
    RaftConfig,
    StorageConfig,
)

__all__ = [
    "CONFIG_FILE_NAMES", "ENV_PREFIX", "GRPC_SERVING", "IGNORED", "KEY_DOCS", "KEYS",
    "LOG_LEVELS", "LOG_MODES", "AuthConfig", "ClusterConfig", "Config", "ConfigError",
    "FaultsConfig", "GrpcConfig", "HttpConfig", "KeySpec", "LoggingConfig", "ProfilingConfig",
    "PrometheusConfig",
    "QueueConfig", "RaftConfig", "StorageConfig", "env_names", "load_config",
    "raft_bind_host", "split_host_port",
]
