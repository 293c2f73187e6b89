"""The doq.py command line: docopt usage, flags, exit codes (SPEC §8.3, §9)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import doq
from doq_lib.config import IGNORED, KEY_DOCS, KEYS, Config, env_names

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "doq.py"


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """main() reads os.environ and the working directory: make both neutral."""
    monkeypatch.chdir(tmp_path)
    for key in KEYS:
        for name in env_names(key):
            monkeypatch.delenv(name, raising=False)


def run_main(argv: list[str]) -> int | str | None:
    """main()'s return value, or the code docopt exits with (--help, --version)."""
    try:
        return doq.main(argv)
    except SystemExit as exc:
        return exc.code


def test_help_lists_the_commands_and_serve_help_every_flag_but_the_ignored(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``doq --help`` lists the commands (no option, no configuration flag) and says where
    the rest is; ``doq serve --help`` has every configuration flag but the keys accepted
    only for the original's sake, saying how many there are; docopt still accepts them."""
    assert run_main(["--help"]) in (None, 0)
    out = capsys.readouterr().out
    assert "Usage:" in out and "  doq [serve] [options]" in out and "doq.py" not in out
    assert "Commands:" in out and "  worker        Run the tasks" in out and "Exit codes:" in out
    assert "Options:" not in out and "--http.port" not in out and "  --concurrency=" not in out
    assert "doq <command> --help" in out and "doq serve --help" in out
    assert len(out.splitlines()) < 60
    assert run_main(["serve", "--help"]) in (None, 0)
    out = capsys.readouterr().out
    assert "  --config=<path>" in out and "Every configuration key below is a flag" in out
    ignored = {key for key in KEYS if IGNORED in KEY_DOCS[key]}
    assert ignored and f"({len(ignored)} more keys of the original's configuration" in out
    for key in (*KEYS, "config"):
        assert (f"--{key}=<" in out) == (key not in ignored), key
    for key in ignored:
        assert doq.config_flags(doq.parse_args([f"--{key}=1"])) == {key: "1"}


@pytest.mark.parametrize(("argv", "first", "usage"), [
    (["keys"], "doq keys: say which: add, list or revoke", "  doq keys revoke --name=<name>"),
    (["keys", "add", "--name=a"], "doq keys: --role is required", "  doq keys add --name"),
    (["serve", "--bogus"], "doq serve: unknown option --bogus", "  doq [serve] [options]"),
    (["--http.prot=1"], "doq: unknown option --http.prot (did you mean --http.port?)",
     "  doq [serve] [options]"),
    (["--http.port"], "doq: --http.port needs a value (--http.port=...)",
     "  doq [serve] [options]"),
    (["get"], "doq get: say which: queues or messages", "  doq get messages"),
    (["backup", "--url=http://127.0.0.1:1"], "doq backup: --output is required",
     "  doq backup --url=<url>..."),
    (["worker"], "doq worker: <app> is required", "  doq worker <app> --queues"),
    (["certs"], "doq certs: --out is required", "  doq certs --out=<dir>"),
])
def test_usage_errors_say_what_is_wrong_and_the_usage_that_helps(
        argv: list[str], first: str, usage: str, capsys: pytest.CaptureFixture[str]) -> None:
    """No docopt internals, no 17-line dump: the problem, the usage of that command only, and
    where its help is."""
    assert doq.main(argv) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == first, err
    assert lines[1] == "Usage:" and any(line.startswith(usage) for line in lines), err
    command = "serve" if first.startswith("doq:") else first.split()[1].rstrip(":")
    assert lines[-1] == f"Run 'doq {command} --help' for its options.", err
    assert "Argument(" not in err and "Option(" not in err and "Warning" not in err
    assert len(lines) <= 8, err


def test_an_unknown_command_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert doq.main(["bogus"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "doq: unknown command 'bogus'; the commands are serve, backup, restore, tui, keys, "
        "certs, secret, get, worker", "Run 'doq --help' for what each does."]


@pytest.mark.parametrize(("command", "has", "lacks"), [
    ("backup", ["doq backup --url=<url>...", "--since=<n>", "--api-key=<key>"],
     ["--role=<role>", "--http.port=<int>", "doq keys"]),
    ("keys", ["doq keys add", "doq keys revoke", "--role=<role>", "--keys-file=<file>"],
     ["--since=<n>", "--http.port=<int>"]),
    ("get", ["doq get messages", "--limit=<n>", "--last-id=<id>",
             "--storage.data_dir=<text>"], ["--role=<role>"]),
    ("serve", ["doq [serve] [options]", "--http.port=<int>", "Configuration options:"],
     ["--role=<role>", "doq backup"]),
])
def test_a_command_help_shows_that_command_only(
        command: str, has: list[str], lacks: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    """``doq <command> --help`` (or -h) answers even when the command's required
    arguments are missing: its usage, its description and its options."""
    for flag in ("--help", "-h"):
        assert doq.main([command, flag]) == 0
        out = capsys.readouterr().out
        for text in has:
            assert text in out, (text, out)
        for text in lacks:
            assert text not in out, (text, out)


def test_usage_gives_no_docopt_defaults() -> None:
    assert "[default:" not in doq.usage().lower()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main(["--version"]) in (None, 0)
    assert capsys.readouterr().out.strip() == f"doq {doq.__version__}"


def test_bad_flag_value_exits_2_naming_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert doq.main(["serve", "--http.port=abc"]) == 2
    err = capsys.readouterr().err
    assert "doq: http.port: expected an integer, got 'abc' (from --http.port)" in err


def test_every_problem_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert doq.main(["--raft.address", "abc", "--queue.stats.window_side", "0"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert sorted(lines) == [
        "doq: queue.stats.window_side: expected an integer >= 1, got 0",
        "doq: raft.address: expected host:port, got 'abc'",
    ]


SERVE_FLAGS = [
    "--http.port=8001", "--cluster.node_id", "node-1", "--raft.address=localhost:9001",
    "--grpc.address", "localhost:10001", "--cluster.join_addr=localhost:8000",
    "--cluster.peers=localhost:9000,localhost:9001", "--storage.data_dir", "d",
    "--queue.default_acknowledgement_timeout=60", "--queue.stats.window_side", "5",
    "--prometheus.enabled", "true",
]


def test_flags_without_serve_parse_as_with_serve(tmp_path: Path) -> None:
    bare = doq.parse_serve(SERVE_FLAGS, {}, str(tmp_path))
    assert doq.parse_serve(["serve", *SERVE_FLAGS], {}, str(tmp_path)) == bare
    assert bare != Config()
    assert (bare.http.port, bare.cluster.node_id, bare.raft.address) == (
        8001, "node-1", "localhost:9001")
    assert bare.grpc.address == "localhost:10001"
    assert bare.cluster.join_addr == "localhost:8000"
    assert bare.cluster.peers == ("localhost:9000", "localhost:9001")
    assert (bare.storage.data_dir, bare.prometheus.enabled) == ("d", True)
    assert (bare.queue.default_acknowledgement_timeout, bare.queue.stats_window_side) == (60, 5)


@pytest.mark.parametrize("key", sorted(KEYS))
def test_every_key_is_a_flag(key: str) -> None:
    args = doq.parse_args([f"--{key}=x"])
    assert doq.config_flags(args) == {key: "x"}


def test_only_given_flags_are_passed_on(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("http: {port: 8100}\nraft: {max_inflight: 2}\n",
                                          encoding="utf-8")
    env = {"RAFT.MAX_INFLIGHT": "6", "DOQ_CLUSTER_NODE_ID": "env-node"}
    cfg = doq.parse_serve(["serve", "--cluster.node_id=flag-node"], env, str(tmp_path))
    assert cfg.http.port == 8100
    assert cfg.raft.max_inflight == 6
    assert cfg.cluster.node_id == "flag-node"


def test_config_flag_selects_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("http: {port: 8100}\n", encoding="utf-8")
    (tmp_path / "other.yaml").write_text("http: {port: 8200}\n", encoding="utf-8")
    cfg = doq.parse_serve(["--config", "other.yaml"], {}, str(tmp_path))
    assert cfg.http.port == 8200


def test_warnings_are_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.yaml").write_text("queue: {acknowledgement_timeout: 60}\n",
                                          encoding="utf-8")
    cfg = doq.checked_config(doq.parse_args(["serve"]), {}, str(tmp_path))
    assert cfg is not None and cfg.queue.default_acknowledgement_timeout == 1800
    err = capsys.readouterr().err
    assert err.startswith("doq: warning: config.yaml: unknown key 'queue.acknowledgement_timeout'")


def test_missing_config_file_is_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert doq.checked_config(doq.parse_args(["--config=gone.yaml"]), {}, str(tmp_path)) is None
    assert capsys.readouterr().err == "doq: config: file not found: gone.yaml\n"


def run_script(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False)


def test_script_help_end_to_end(tmp_path: Path) -> None:
    done = run_script([str(SCRIPT), "serve", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--queue.stats.window_side=<int>" in done.stdout


def test_config_errors_exit_before_gevent_is_touched(tmp_path: Path) -> None:
    code = ("import sys, doq; rc = doq.main(['serve', '--http.port=abc']); "
            "print(rc, 'gevent' in sys.modules, 'doq_lib.server' in sys.modules)")
    done = run_script(["-c", code], REPO)
    assert done.stdout.split() == ["2", "False", "False"], done.stderr
    assert "http.port" in done.stderr


def test_backup_says_when_it_cannot_connect_and_when_no_node_leads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listening: "cannot connect", naming the address and the error; a node that
    answers but names no leader: "no node reports a leader". Both exit 3, no file left."""
    import http.server
    import threading

    from tests.harness import free_ports

    port, = free_ports(1)
    out = tmp_path / "b.bak"
    assert doq.main(["backup", f"--url=http://127.0.0.1:{port}", f"--output={out}",
                     "--timeout=5"]) == 3
    assert capsys.readouterr().err.strip() == (
        f"doq: cannot connect to any node (127.0.0.1:{port}: [Errno 111] Connection refused)")

    class NoLeader(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = b'{"servers": [{"id": "n0", "addr": "127.0.0.1:1", "is_leader": false}]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NoLeader)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert doq.main(["backup", f"--url=http://127.0.0.1:{server.server_port}",
                         f"--output={out}", "--timeout=5"]) == 3
    finally:
        server.shutdown()
        server.server_close()
    assert capsys.readouterr().err.strip() == \
        "doq: no node reports a leader: backups and restores need one"
    assert list(tmp_path.iterdir()) == []


def test_secret_makes_a_new_cluster_secret_only_its_owner_reads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert doq.main(["secret"]) == 0
    printed = capsys.readouterr().out
    assert re.fullmatch(r"[0-9a-f]{64}\n", printed)
    path = tmp_path / "doq-cluster-secret"
    assert doq.main(["secret", f"--file={path}"]) == 0
    written = path.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}\n", written) and written != printed
    assert path.stat().st_mode & 0o777 == 0o600
    capsys.readouterr()
    assert doq.main(["secret", f"--file={path}"]) == 1       # never overwritten
    assert "a secret is never overwritten" in capsys.readouterr().err
    assert path.read_text() == written
    from doq_lib.secret import ClusterSecret

    ClusterSecret(written.strip())                          # usable as raft.password_file
