"""`pip install .` gives a working `doq` command with everything a node serves."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from tests.harness import REPO, Http, free_ports, wait_until

SKIP = shutil.ignore_patterns(".venv", ".git", "__pycache__", ".mypy_cache", ".ruff_cache",
                              ".pytest_cache", "data", "build", "*.egg-info", "artifacts")


@contextlib.contextmanager
def serving(command: list[str], env: dict[str, str], tmp_path: Path,
            *flags: str) -> Iterator[Http]:
    """A node started by ``command`` (then ``serve``, its loopback addresses and ``flags``),
    ready; its output in node.log; stopped on leaving the block."""
    http_port, raft_port = free_ports(2)
    log = open(tmp_path / "node.log", "wb")
    node = subprocess.Popen([*command, "serve", f"--http.port={http_port}",
                             "--http.host=127.0.0.1", f"--raft.address=127.0.0.1:{raft_port}",
                             f"--storage.data_dir={tmp_path / 'data'}", *flags],
                            env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: Http(http_port, timeout=2).get("/readyz").status == 200, 30,
                   describe=lambda: (tmp_path / "node.log").read_text()[-3000:])
        yield Http(http_port)
    finally:
        node.terminate()
        node.wait(timeout=20)
        log.close()


def test_pip_install_gives_the_doq_command(tmp_path: Path) -> None:
    source, target = tmp_path / "src", tmp_path / "site"
    shutil.copytree(REPO, source, ignore=SKIP)          # builds write into the source tree
    before = {path.relative_to(source).parts[0] for path in source.iterdir()}
    # --no-deps: the dependencies are the venv's already (no network in the test)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-build-isolation", "--target", str(target), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # what the build left in the source tree is ignored by git (no untracked build/)
    for left in sorted({path.name for path in source.iterdir()} - before):
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", left + "/"],
                                 cwd=REPO, capture_output=True, timeout=30)
        assert ignored.returncode == 0, f"pip install . leaves {left}/ untracked"
    for installed in ["doq.py", "doq_lib/fsm/machine.py", "doq_lib/pb/doq_pb2.py",
                      "tui/app.py", "tui/app.tcss", "webui/index.html", "webui/docs.html",
                      "webui/assets/app.js", "webui/assets/vendor/swagger-ui/swagger-ui.css"]:
        assert (target / installed).is_file(), installed
    command = target / "bin" / "doq"
    assert command.is_file()
    env = {**os.environ, "PYTHONPATH": str(target)}
    version = subprocess.run([str(command), "--version"], capture_output=True, text=True,
                             timeout=60, env=env, cwd=tmp_path)
    assert (version.returncode, version.stdout.strip()) == (0, "doq 0.1.0"), version.stderr
    usage = subprocess.run([str(command), "--help"], capture_output=True, text=True,
                           timeout=60, env=env, cwd=tmp_path)
    assert usage.returncode == 0 and "  doq backup --url" in usage.stdout
    # the installed command runs a node that serves the API, the web UI and the API docs
    with serving([str(command)], env, tmp_path, "--cluster.node_id=p0") as http:
        assert http.post("/API/v1/queues", {"name": "p", "type": "delayed"}).status == 200
        for page, text in [("/", b"<html"), ("/docs", b"swagger"),
                           ("/assets/app.js", b"function")]:
            answer = http.get(page)
            assert answer.status == 200 and text in answer.body.lower(), page


#: What requirements-dev.txt adds, by the names Python imports them under.
DEV_ONLY = ("pytest", "_pytest", "pytest_timeout", "uvloop", "ruff", "mypy",
            "kubernetes_validate", "check_jsonschema", "dnslib", "grpc_tools", "playwright",
            "hypothesis", "matplotlib", "celery", "kombu", "django", "django_tasks",
            "opentelemetry", "mkdocs", "material")


def test_make_run_installs_what_a_node_needs_and_make_test_the_rest(tmp_path: Path) -> None:
    """``make run`` installs requirements.txt only (``make -n`` shows the commands without
    running them), ``make test`` adds requirements-dev.txt; and a node runs with none of the
    development packages importable: it starts, serves and takes a message."""
    for name in ("Makefile", "requirements.txt", "requirements-dev.txt"):
        shutil.copy(Path(REPO) / name, tmp_path / name)

    def planned(target: str) -> str:
        done = subprocess.run(["make", "-n", target], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout
    run = planned("run")
    assert "-r requirements.txt" in run and "requirements-dev.txt" not in run, run
    assert "-r requirements-dev.txt" in planned("lint")

    blocker = tmp_path / "site" / "sitecustomize.py"
    blocker.parent.mkdir()
    blocker.write_text(
        "import sys\n"
        f"BLOCKED = {DEV_ONLY!r}\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ImportError(f'{name} is a development package')\n"
        "sys.meta_path.insert(0, Block())\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(blocker.parent)}
    probe = subprocess.run([sys.executable, "-c", "import uvloop"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert "development package" in probe.stderr       # the block works
    with serving([sys.executable, str(Path(REPO) / "doq.py")], env, tmp_path,
                 "--grpc.address=127.0.0.1:0") as http:
        assert http.post("/API/v1/queues", {"name": "r", "type": "delayed"}).status == 200
        assert http.post("/API/v1/queues/r/messages",
                         {"content": "x", "priority": 1}).status == 200
    assert "Traceback" not in (tmp_path / "node.log").read_text()
