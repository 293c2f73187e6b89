"""Configuration: defaults, sources and precedence, files, types, validation (SPEC §9)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from doq_lib.config import (
    KEY_DOCS,
    KEYS,
    ClusterConfig,
    Config,
    ConfigError,
    QueueConfig,
    RaftConfig,
    env_names,
    load_config,
    split_host_port,
)

# Every key and default of SPEC §9 (the reference's TestInitCobraCommand__DefaultValues).
SPEC_DEFAULTS = {
    "profiling.enabled": False,
    "profiling.port": 6060,
    "prometheus.enabled": False,
    "logging.mode": "console",
    "logging.level": "warning",
    "http.port": 8000,
    "grpc.address": "",
    "raft.address": "localhost:9000",
    "raft.apply_timeout": 5,
    "storage.data_dir": "data",
    "storage.gc_interval": 300,
    "storage.gc_discard_ratio": 0.7,
    "storage.compression": "",
    "storage.zstd_compression_level": 0,
    "storage.block_cache_size": 0,
    "storage.index_cache_size": 0,
    "storage.base_table_size": 0,
    "storage.base_level_size": 0,
    "storage.num_compactors": 0,
    "storage.num_level_zero_tables": 0,
    "storage.num_level_zero_tables_stall": 0,
    "storage.num_memtables": 0,
    "storage.value_log_file_size": 0,
    "cluster.namespace": "default",
    "cluster.node_id": "node-0",
    "cluster.service_name": "",
    "cluster.join_addr": "",
    "queue.acknowledgement_check_interval": 1,
    "queue.default_acknowledgement_timeout": 1800,
    "queue.stats.window_side": 10,
}

# Keys this implementation adds (Raft tuning, LMDB, bind host, static peers: README's
# configuration table).
EXTENSION_DEFAULTS = {
    "http.host": "", "http.advertise": "", "grpc.advertise": "",
    "http.cors_origins": (),
    "http.tls_cert": "",
    "http.tls_key": "",
    "http.tls_client_ca": "",
    "http.header_timeout": 10.0, "http.body_timeout": 30.0, "http.idle_timeout": 120.0,
    "http.request_timeout": 60.0, "http.min_body_rate": 8192,
    "http.max_connections": 10000, "storage.min_free_bytes": 64 << 20,
    "http.max_held_bytes": 256 << 20,
    "grpc.tls_cert": "",
    "grpc.tls_key": "",
    "grpc.tls_client_ca": "",
    "grpc.serving": "hub",
    "grpc.max_connections": 10000, "grpc.max_held_bytes": 256 << 20,
    "cluster.tls_ca": "",
    "auth.keys_file": "",
    "raft.bind_address": "",
    "raft.password": "",
    "raft.password_file": "",
    "raft.tick_period": 0.25,
    "raft.append_entries_period": 0.1,
    "raft.election_timeout_min": 0.6,
    "raft.election_timeout_max": 1.4,
    "raft.leader_fallback_timeout": 2.0,
    "raft.connection_retry_time": 0.5,
    "raft.max_batch_bytes": 1048576,
    "raft.max_inflight": 4,
    "raft.pipeline_entries": 1,
    "raft.snapshot_min_entries": 50000,
    "raft.snapshot_max_log_bytes": 256 << 20,
    "raft.snapshot_min_interval": 300.0,
    "raft.fsync_in_thread": True,
    "raft.apply_in_thread": False,
    "storage.map_size": 1 << 36,
    "storage.history_seconds": 86400,
    "storage.fsync_store": False,
    "cluster.peers": (),
    "faults.enabled": False, "faults.clock_offset_file": "", "faults.fail_fsync_file": "",
    "faults.fail_write_file": "",
}


def load(tmp_path: Path, flags: dict[str, str] | None = None,
         env: dict[str, str] | None = None, config_path: str | None = None) -> Config:
    return load_config(flags or {}, env or {}, config_path, str(tmp_path))


def problems_of(tmp_path: Path, **kwargs: object) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, **kwargs)  # type: ignore[arg-type]
    return caught.value.problems


# --- defaults and keys --------------------------------------------------------------

@pytest.mark.parametrize(("key", "expected"), sorted(SPEC_DEFAULTS.items()))
def test_spec_default(tmp_path: Path, key: str, expected: object) -> None:
    assert load(tmp_path).value(key) == expected


@pytest.mark.parametrize(("key", "expected"), sorted(EXTENSION_DEFAULTS.items()))
def test_extension_default(tmp_path: Path, key: str, expected: object) -> None:
    assert load(tmp_path).value(key) == expected


def test_nothing_given_means_the_dataclass_defaults(tmp_path: Path) -> None:
    cfg = load(tmp_path)
    assert cfg == Config()
    assert cfg.warnings == ()
    assert Config().validate() == []


def test_keys_are_exactly_the_spec_keys_and_extensions() -> None:
    assert set(KEYS) == set(SPEC_DEFAULTS) | set(EXTENSION_DEFAULTS)
    assert KEYS["queue.stats.window_side"] == ("queue", "stats_window_side", int)
    assert KEYS["cluster.peers"] == ("cluster", "peers", tuple)
    assert KEYS["raft.apply_timeout"].type is float


def test_every_key_has_a_one_line_doc() -> None:
    assert set(KEY_DOCS) == set(KEYS)
    assert all(doc and "\n" not in doc for doc in KEY_DOCS.values())


def test_environment_names_are_unique() -> None:
    names = [name for key in KEYS for name in env_names(key)]
    assert len(names) == len(set(names))
    assert env_names("queue.stats.window_side") == (
        "QUEUE.STATS.WINDOW_SIDE", "DOQ_QUEUE_STATS_WINDOW_SIDE")


def test_node_dir_is_data_dir_slash_node_id(tmp_path: Path) -> None:
    cfg = load(tmp_path, flags={"storage.data_dir": "d", "cluster.node_id": "n1"})
    assert Path(cfg.node_dir) == Path("d", "n1")


# --- precedence: flag > environment > file > default ------------------------------

PRECEDENCE_CASES = [
    # key, file value, environment value, flag value, expected typed values (f, e, fl)
    ("http.port", 8001, "8002", "8003", (8001, 8002, 8003)),
    ("cluster.node_id", "node-file", "node-env", "node-flag",
     ("node-file", "node-env", "node-flag")),
    ("queue.stats.window_side", 5, "6", "7", (5, 6, 7)),
    ("prometheus.enabled", True, "false", "true", (True, False, True)),
    ("raft.apply_timeout", 2, "3.5", "4", (2.0, 3.5, 4.0)),
]


def write_nested(directory: Path, key: str, value: object,
                 name: str = "config.yaml") -> Path:
    document: object = value
    for part in reversed(key.split(".")):
        document = {part: document}
    path = directory / name
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


@pytest.mark.parametrize(("key", "file_value", "env_value", "flag_value", "expected"),
                         PRECEDENCE_CASES)
@pytest.mark.parametrize("env_form", [0, 1], ids=["dotted-env", "DOQ_-env"])
def test_precedence(tmp_path: Path, key: str, file_value: object, env_value: str,
                    flag_value: str, expected: tuple[object, ...], env_form: int) -> None:
    default = Config().value(key)
    env = {env_names(key)[env_form]: env_value}
    flags = {key: flag_value}
    assert load(tmp_path, flags=flags, env=env).value(key) == expected[2]
    write_nested(tmp_path, key, file_value)
    assert load(tmp_path, flags=flags, env=env).value(key) == expected[2]
    assert load(tmp_path, env=env).value(key) == expected[1]
    assert load(tmp_path).value(key) == expected[0]
    (tmp_path / "config.yaml").unlink()
    assert load(tmp_path).value(key) == default


def test_dotted_environment_name_wins_over_doq_name(tmp_path: Path) -> None:
    env = {"QUEUE.STATS.WINDOW_SIDE": "3", "DOQ_QUEUE_STATS_WINDOW_SIDE": "4"}
    assert load(tmp_path, env=env).queue.stats_window_side == 3


def test_empty_environment_variable_counts_as_unset(tmp_path: Path) -> None:
    env = {"HTTP.PORT": "", "DOQ_HTTP_PORT": "8005", "CLUSTER.NODE_ID": ""}
    cfg = load(tmp_path, env=env)
    assert (cfg.http.port, cfg.cluster.node_id) == (8005, "node-0")


def test_flag_given_as_empty_string_overrides_lower_sources(tmp_path: Path) -> None:
    env = {"GRPC.ADDRESS": "localhost:10000"}
    assert load(tmp_path, env=env, flags={"grpc.address": ""}).grpc.address == ""


def test_flags_given_as_none_are_not_given(tmp_path: Path) -> None:
    flags: dict[str, str | None] = {"http.port": None}
    cfg = load_config(flags, {"HTTP.PORT": "8009"}, None, str(tmp_path))
    assert cfg.http.port == 8009


def test_unrelated_environment_is_ignored(tmp_path: Path) -> None:
    env = {"PATH": "/bin", "PORT": "1", "DOQ_SOMETHING": "x", "HTTP_PORT": "1"}
    assert load(tmp_path, env=env) == Config()


# --- config files ---------------------------------------------------------------------

NESTED_YAML = """\
http:
  port: 8100
  host: 127.0.0.1
queue:
  default_acknowledgement_timeout: 60
  stats:
    window_side: 5
cluster:
  peers: [localhost:9000, localhost:9001, localhost:9002]
prometheus:
  enabled: true
"""


def test_nested_yaml(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(NESTED_YAML, encoding="utf-8")
    cfg = load(tmp_path)
    assert (cfg.http.port, cfg.http.host) == (8100, "127.0.0.1")
    assert cfg.queue == QueueConfig(default_acknowledgement_timeout=60, stats_window_side=5)
    assert cfg.cluster.peers == ("localhost:9000", "localhost:9001", "localhost:9002")
    assert cfg.prometheus.enabled is True
    assert cfg.warnings == ()


def test_flat_dotted_keys_and_mixed_nesting(tmp_path: Path) -> None:
    (tmp_path / "config.yml").write_text(
        "http.port: '8200'\nqueue.stats.window_side: 7\n"
        "queue:\n  stats.window_side: 8\ncluster.peers: 'a:1, b:2'\n", encoding="utf-8")
    cfg = load(tmp_path)
    assert cfg.http.port == 8200
    assert cfg.queue.stats_window_side == 8  # the later spelling wins, with a warning
    assert cfg.cluster.peers == ("a:1", "b:2")
    assert any("more than once" in warning for warning in cfg.warnings)


def test_json_file(tmp_path: Path) -> None:
    document = {"storage": {"data_dir": "jsondata"}, "logging": {"level": "info"},
                "raft": {"address": "127.0.0.1:9100"}}
    (tmp_path / "config.json").write_text(json.dumps(document), encoding="utf-8")
    cfg = load(tmp_path)
    assert (cfg.storage.data_dir, cfg.logging.level) == ("jsondata", "info")
    assert cfg.raft.address == "127.0.0.1:9100"


def test_discovery_prefers_config_yaml(tmp_path: Path) -> None:
    write_nested(tmp_path, "http.port", 1, "config.json")
    write_nested(tmp_path, "http.port", 2, "config.yml")
    assert load(tmp_path).http.port == 2
    write_nested(tmp_path, "http.port", 3, "config.yaml")
    assert load(tmp_path).http.port == 3


def test_explicit_config_path_relative_to_cwd_or_absolute(tmp_path: Path) -> None:
    write_nested(tmp_path, "http.port", 1, "config.yaml")
    (tmp_path / "etc").mkdir()
    explicit = write_nested(tmp_path / "etc", "http.port", 9, "doq.yaml")
    assert load(tmp_path, config_path="etc/doq.yaml").http.port == 9
    assert load(tmp_path, config_path=str(explicit)).http.port == 9


def test_explicit_config_path_that_is_missing_is_an_error(tmp_path: Path) -> None:
    write_nested(tmp_path, "http.port", 1, "config.yaml")
    problems = problems_of(tmp_path, config_path="nope.yaml")
    assert problems == ["config: file not found: nope.yaml"]


def test_empty_file_is_fine(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("", encoding="utf-8")
    assert load(tmp_path) == Config()


@pytest.mark.parametrize("text", ["http: [1, 2", "- just\n- a list\n", "42\n"])
def test_unusable_file_is_an_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "config.yaml").write_text(text, encoding="utf-8")
    (problem,) = problems_of(tmp_path)
    assert problem.startswith("config: config.yaml")


def test_shipped_example_file_loads_and_its_unknown_key_has_no_effect(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("""\
prometheus:
  enabled: true
logging:
  level: info
storage:
  data_dir: data
  compression: none
  block_cache_size: 268435456
  base_table_size: 16777216
  base_level_size: 67108864
queue:
  acknowledgement_check_interval: 1
  acknowledgement_timeout: 60
""", encoding="utf-8")
    cfg = load(tmp_path)
    assert cfg.prometheus.enabled is True
    assert cfg.logging.level == "info"
    assert cfg.storage.block_cache_size == 268435456
    assert cfg.queue.default_acknowledgement_timeout == 1800
    assert cfg.warnings == (
        "config.yaml: unknown key 'queue.acknowledgement_timeout' ignored "
        "(did you mean 'queue.default_acknowledgement_timeout'?)",)


def test_unknown_sections_and_config_key_are_warnings(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "config: other.yaml\nmystery: {a: 1}\nhttp: {port: 8001, colour: red}\n",
        encoding="utf-8")
    cfg = load(tmp_path)
    assert cfg.http.port == 8001
    assert [w.split(" ignored")[0] for w in cfg.warnings] == [
        "config.yaml: unknown key 'config'",
        "config.yaml: unknown key 'mystery'",
        "config.yaml: unknown key 'http.colour'",
    ]


def test_warnings_are_not_part_of_equality(tmp_path: Path) -> None:
    assert replace(Config(), warnings=("x",)) == Config()


def test_key_without_value_is_ignored_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("grpc:\n  address:\n", encoding="utf-8")
    cfg = load(tmp_path)
    assert cfg.grpc.address == ""
    assert cfg.warnings == ("config.yaml: key 'grpc.address' has no value; ignored",)


# --- types ------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("true", True), ("TRUE", True), ("1", True), ("yes", True), ("Yes", True),
    ("false", False), ("False", False), ("0", False), ("no", False), ("NO", False),
])
def test_boolean_spellings(tmp_path: Path, text: str, expected: bool) -> None:
    cfg = load(tmp_path, flags={"prometheus.enabled": text, "profiling.enabled": text})
    assert cfg.prometheus.enabled is expected
    assert cfg.profiling.enabled is expected


def test_numbers_from_strings_and_yaml_scalars(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "raft: {apply_timeout: 7, tick_period: '0.01'}\nhttp: {port: '0'}\n"
        "storage: {gc_discard_ratio: 0.5}\ncluster: {node_id: 12}\n", encoding="utf-8")
    cfg = load(tmp_path, flags={"raft.max_inflight": " 8 "})
    assert (cfg.raft.apply_timeout, cfg.raft.tick_period) == (7.0, 0.01)
    assert cfg.http.port == 0
    assert cfg.storage.gc_discard_ratio == 0.5
    assert cfg.cluster.node_id == "12"
    assert cfg.raft.max_inflight == 8


def test_peers_from_a_comma_separated_flag(tmp_path: Path) -> None:
    flags = {"cluster.peers": "localhost:9000, localhost:9001,,localhost:9002"}
    assert load(tmp_path, flags=flags).cluster.peers == (
        "localhost:9000", "localhost:9001", "localhost:9002")


def test_every_type_error_is_reported_with_key_and_source(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "raft: {apply_timeout: soon}\ncluster: {peers: {a: 1}}\nlogging: {mode: [x]}\n",
        encoding="utf-8")
    problems = problems_of(
        tmp_path,
        flags={"http.port": "abc", "prometheus.enabled": "maybe"},
        env={"QUEUE.STATS.WINDOW_SIDE": "1.5", "DOQ_RAFT_TICK_PERIOD": "nan"})
    assert sorted(problems) == [
        "cluster.peers: expected a comma-separated list, got {'a': 1} (from config.yaml)",
        "http.port: expected an integer, got 'abc' (from --http.port)",
        "logging.mode: expected a string, got ['x'] (from config.yaml)",
        "prometheus.enabled: expected true/false, 1/0 or yes/no, got 'maybe' "
        "(from --prometheus.enabled)",
        "queue.stats.window_side: expected an integer, got '1.5' "
        "(from environment QUEUE.STATS.WINDOW_SIDE)",
        "raft.apply_timeout: expected a number, got 'soon' (from config.yaml)",
        "raft.tick_period: expected a number, got 'nan' (from environment DOQ_RAFT_TICK_PERIOD)",
    ]


def test_unknown_flag_key_is_an_error(tmp_path: Path) -> None:
    assert problems_of(tmp_path, flags={"http.prot": "1"}) == [
        "http.prot: unknown configuration key (from --http.prot)"]


# --- validation -------------------------------------------------------------------------

def test_validate_reports_every_problem_at_once(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, flags={
        "raft.address": "abc",
        "http.port": "70000",
        "logging.level": "loud",
        "logging.mode": "syslog",
        "queue.stats.window_side": "0",
        "queue.default_acknowledgement_timeout": "-1",
        "cluster.join_addr": "localhost",
        "cluster.node_id": "../x",
        "storage.gc_discard_ratio": "1.5",
    })
    assert sorted(problem.split(":")[0] for problem in problems) == [
        "cluster.join_addr", "cluster.node_id", "http.port", "logging.level",
        "logging.mode", "queue.default_acknowledgement_timeout",
        "queue.stats.window_side", "raft.address", "storage.gc_discard_ratio",
    ]
    assert "raft.address: expected host:port, got 'abc'" in problems


def test_validate_returns_a_list_naming_keys() -> None:
    cfg = replace(Config(), queue=QueueConfig(0, 0, 0))
    assert cfg.validate() == [
        "queue.acknowledgement_check_interval: expected an integer >= 1, got 0",
        "queue.default_acknowledgement_timeout: expected an integer >= 1, got 0",
        "queue.stats.window_side: expected an integer >= 1, got 0",
    ]


ADVERTISE = "expected host:port (a port 1-65535, at most 255 characters) or empty"


@pytest.mark.parametrize(("flag", "value", "problem"), [
    ("http.header_timeout", "0", "http.header_timeout: expected a number > 0, got 0.0"),
    ("http.body_timeout", "-1", "http.body_timeout: expected a number > 0, got -1.0"),
    ("http.idle_timeout", "0", "http.idle_timeout: expected a number > 0, got 0.0"),
    ("http.max_connections", "0", "http.max_connections: expected an integer >= 1, got 0"),
    ("grpc.max_connections", "0", "grpc.max_connections: expected an integer >= 1, got 0"),
    ("http.advertise", "127.0.0.1:0", f"http.advertise: {ADVERTISE}, got '127.0.0.1:0'"),
    ("http.advertise", ":8000", f"http.advertise: {ADVERTISE}, got ':8000'"),
    ("http.advertise", "http://h:1", f"http.advertise: {ADVERTISE}, got 'http://h:1'"),
    ("grpc.advertise", "h:65536", f"grpc.advertise: {ADVERTISE}, got 'h:65536'"),
    ("grpc.advertise", "a" * 253 + ":10",
     f"grpc.advertise: {ADVERTISE}, got '" + "a" * 253 + ":10'"),
    ("grpc.max_held_bytes", "2097161", "grpc.max_held_bytes: expected at least 2097162 (two "
     "of the largest requests), got 2097161"),
    ("http.max_held_bytes", "0", "http.max_held_bytes: expected at least 2097162 (two "
     "of the largest requests), got 0"),
])
def test_http_limits_must_be_positive(tmp_path: Path, flag: str, value: str,
                                      problem: str) -> None:
    assert problems_of(tmp_path, flags={flag: value}) == [problem]


@pytest.mark.parametrize("mode", ["thread", "gevent", "HUB", ""])
def test_grpc_serving_names_the_one_mode_left(tmp_path: Path, mode: str) -> None:
    """The thread and gevent modes are gone: a configuration that still names one is refused
    with the reason, not served some other way without a word."""
    problems = problems_of(tmp_path, flags={"grpc.serving": mode})
    assert problems == [f"grpc.serving: expected hub: the thread and gevent modes are gone "
                        f"(the event loop serves gRPC faster, docs/BENCHMARKS.md); leave the "
                        f"setting out, got {mode!r}"], problems
    assert load(tmp_path, flags={"grpc.serving": "hub"}).grpc.serving == "hub"


def test_byte_budgets_accept_their_least_and_huge_values(tmp_path: Path) -> None:
    for held, connections in (("2097162", "1"), (str(2 ** 62), str(2 ** 62))):
        cfg = load(tmp_path, flags={"grpc.max_held_bytes": held, "http.max_held_bytes": held,
                                    "grpc.max_connections": connections})
        assert (cfg.grpc.max_held_bytes, cfg.grpc.max_connections) == (int(held),
                                                                       int(connections))
        assert cfg.http.max_held_bytes == int(held)


@pytest.mark.parametrize(("changes", "key"), [
    ({"election_timeout_min": 1.4}, "raft.election_timeout_min"),
    ({"election_timeout_min": 2.0}, "raft.election_timeout_min"),
    ({"append_entries_period": 0.2}, "raft.append_entries_period"),
    ({"leader_fallback_timeout": 0.03}, "raft.leader_fallback_timeout"),
    ({"max_batch_bytes": 0}, "raft.max_batch_bytes"),
    ({"max_inflight": 0}, "raft.max_inflight"),
    ({"pipeline_entries": 0}, "raft.pipeline_entries"),
    ({"snapshot_min_entries": 0}, "raft.snapshot_min_entries"),
    ({"tick_period": 0.0}, "raft.tick_period"),
    ({"apply_timeout": -1.0}, "raft.apply_timeout"),
    ({"address": "localhost:99999"}, "raft.address"),
    ({"address": ":9000"}, "raft.address"),
    ({"bind_address": "0.0.0.0"}, "raft.bind_address"),
])
def test_raft_rules(changes: dict[str, object], key: str) -> None:
    problems = replace(Config(), raft=RaftConfig(**changes)).validate()  # type: ignore[arg-type]
    assert problems and all(problem.startswith(f"{key}: ") for problem in problems)


SECRET = "a cluster secret of 32 chars...."


@pytest.mark.parametrize("address", [
    "localhost:9000", "127.0.0.1:9000", "[::1]:9000", "node-2.doq.svc:9000", "h:0"])
def test_accepted_raft_addresses(address: str) -> None:
    raft = RaftConfig(address=address, password=SECRET)
    assert replace(Config(), raft=raft).validate() == []


def test_grpc_and_bind_addresses_may_omit_the_host() -> None:
    cfg = replace(Config(), grpc=replace(Config().grpc, address=":10000"),
                  raft=RaftConfig(bind_address="0.0.0.0:9000", password=SECRET))
    assert cfg.validate() == []


def test_bare_raft_port_is_accepted_only_in_kubernetes_mode() -> None:
    plain = replace(Config(), raft=RaftConfig(address="9000", password=SECRET))
    assert plain.validate() == ["raft.address: expected host:port, got '9000'"]
    k8s = replace(plain, cluster=ClusterConfig(service_name="doq"))
    assert k8s.validate() == []


@pytest.mark.parametrize(("raft", "cluster"), [
    (RaftConfig(address="0.0.0.0:9000"), ClusterConfig()),
    (RaftConfig(address="localhost:9000", bind_address=":9000"), ClusterConfig()),
    (RaftConfig(address="node-2.doq.svc:9000"), ClusterConfig()),
    (RaftConfig(address="localhost:9000", bind_address="10.0.0.5:9000"), ClusterConfig()),
    (RaftConfig(address="9000"), ClusterConfig(service_name="doq")),
])
def test_a_reachable_raft_port_needs_the_cluster_secret(raft: RaftConfig,
                                                         cluster: ClusterConfig) -> None:
    problems = replace(Config(), raft=raft, cluster=cluster).validate()
    assert len(problems) == 1 and "without a cluster secret" in problems[0]
    with_secret = replace(Config(), raft=replace(raft, password=SECRET), cluster=cluster)
    assert with_secret.validate() == []


@pytest.mark.parametrize("address", ["localhost:9000", "127.0.0.5:9000", "[::1]:9000"])
def test_loopback_raft_needs_no_secret(address: str) -> None:
    assert replace(Config(), raft=RaftConfig(address=address)).validate() == []


def test_the_secret_file_is_read_and_checked(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\nignored second line\n")
    flags = {"raft.address": "0.0.0.0:9000", "raft.password_file": str(secret)}
    assert load(tmp_path, flags).raft.password_file == str(secret)
    secret.write_text("short\n")
    assert "at least 16 characters" in problems_of(tmp_path, flags=flags)[0]
    secret.write_text("")
    assert "is empty" in problems_of(tmp_path, flags=flags)[0]
    both = {**flags, "raft.password": SECRET}
    assert "not both" in problems_of(tmp_path, flags=both)[0]


def test_each_bad_peer_is_reported() -> None:
    cfg = replace(Config(), cluster=ClusterConfig(
        peers=("localhost:9000", "nohost", "localhost:0", "localhost:9000")))
    assert cfg.validate() == [
        "cluster.peers: expected host:port, got 'nohost'",
        "cluster.peers: expected host:port, got 'localhost:0'",
        "cluster.peers: 'localhost:9000' is listed more than once",
    ]


def test_config_error_carries_every_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, flags={"http.port": "x", "profiling.port": "y"})
    assert len(caught.value.problems) == 2
    assert str(caught.value) == "\n".join(caught.value.problems)


@pytest.mark.parametrize(("address", "expected"), [
    ("localhost:9000", ("localhost", 9000)),
    ("[::1]:80", ("::1", 80)),
    (":10000", ("", 10000)),
])
def test_split_host_port(address: str, expected: tuple[str, int]) -> None:
    assert split_host_port(address) == expected


@pytest.mark.parametrize("address", ["abc", "localhost:", "::1:80", "a b:1", "h:-1", "h:1x"])
def test_split_host_port_rejects(address: str) -> None:
    with pytest.raises(ValueError):
        split_host_port(address)


@pytest.mark.parametrize("value", ["", "127.0.0.1:1", "h:65535", "[::1]:8000",
                                   "a" * 252 + ":10", "node-0.example.com:443"])
def test_advertised_addresses_at_their_bounds_are_accepted(tmp_path: Path, value: str) -> None:
    cfg = load(tmp_path, flags={"http.advertise": value, "grpc.advertise": value})
    assert (cfg.http.advertise, cfg.grpc.advertise) == (value, value)
