"""docker-compose.yml run for real: the three-node cluster in containers, reached only
through the ports it publishes on 127.0.0.1, as a user on the host reaches it.

The cluster is brought up as the README's compose section says, verbatim, in a copy of the
repository (with this checkout's .venv in it, which `make install` then finds set up): the
two commands that make the secrets, then `make compose`, which builds the image from a
Debian base made with debootstrap and wheels built on the host (no container registry is
reached) and runs Compose. The secret files are then as a user's would be: 0600 and owned
by another uid than the container's. Needs root and Debian's docker.io, docker-compose and
debootstrap (scripts/system_deps.sh installs them; a dockerd not running is started here)."""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import pytest

from doq_lib.client import Security, connect, connect_async
from tests.harness import REPO as REPO_DIR
from tests.harness import free_ports
from tests.tools.test_tui import rows, until
from tui.app import ClusterScreen, DoqConsole, QueuesScreen

REPO = Path(REPO_DIR)

pytestmark = pytest.mark.slow

NODES = ("node-0", "node-1", "node-2")
HOST_USER = 1000                 # who owns the secret files, as a user on the host would
T = TypeVar("T")


TASKS = '''
import os
from doq_lib.tasks import App

app = App({url!r}, api_key={key!r})


@app.task(queue="work", name="note")
def note(n):
    with open({log!r}, "a") as f:
        f.write("%d\\n" % n)
'''


def _run(*args: str, cwd: Path, env: dict[str, str], timeout: float = 120,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert not check or done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A running Docker engine: the one there is, or one started here (and stopped after)."""
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0:
        yield
        return
    assert os.geteuid() == 0 and shutil.which("dockerd"), \
        "the compose test needs a running Docker engine, or root and dockerd to start one"
    log = tmp_path_factory.mktemp("dockerd") / "dockerd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["dockerd"], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], capture_output=True,
                             timeout=60).returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=60)


class Compose:
    """The compose project in its directory, with its ports and the admin key."""

    def __init__(self, root: Path, env: dict[str, str], key: str, http: list[int],
                 grpc: list[int], tool: list[str]) -> None:
        self.root, self.env, self.key, self.http, self.grpc = root, env, key, http, grpc
        self.tool = tool

    def __call__(self, *args: str, timeout: float = 180) -> str:
        return _run(*self.tool, *args, cwd=self.root, env=self.env, timeout=timeout).stdout

    def container(self, node: str) -> str:
        return self("ps", "-q", node).strip()

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.http[index]}"

    def request(self, index: int, method: str, path: str, body: Any = None,
                timeout: float = 5) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url(index) + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.key}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def health(self, node: str) -> str:
        cid = self.container(node)
        if not cid:
            return "gone"
        done = _run("docker", "inspect", "-f", "{{.State.Health.Status}}", cid,
                    cwd=self.root, env=self.env, check=False)
        return done.stdout.strip() or "unknown"

    def leader(self, via: int) -> str:
        status, body = self.request(via, "GET", "/API/v1/cluster/servers")
        assert status == 200, body
        (leader,) = [s["id"] for s in body["servers"] if s["is_leader"]]
        return str(leader)

    def index(self, node: str) -> int:
        return NODES.index(node)


def _eventually(what: str, seconds: float, probe: Callable[[], T | None]) -> T:
    deadline = time.monotonic() + seconds
    last: Any = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value is not None and value is not False:
                return value
        except (OSError, AssertionError, ValueError) as exc:
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"{what} not within {seconds} s (last: {last!r})")


def _readme_commands() -> list[str]:
    """The README's compose commands, as written; the compose file's header makes the
    secrets with the same two."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Docker and Kubernetes", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```sh\n(.*?)```", section, re.S)[0]
    commands = [c.strip() for c in block.splitlines() if c.strip()]
    assert commands[0] == "make install" and commands[-1] == "make compose", commands
    header = (REPO / "docker-compose.yml").read_text(encoding="utf-8")
    made = [line[len("#   "):].strip() for line in header.splitlines()
            if line.startswith("#   .venv/bin/python doq.py ")]
    assert made == commands[1:-1], (made, commands)
    return commands


#: Both Compose generations run the whole scenario: v2 (`docker compose`, what Docker ships
#: now) and 1.29 (`docker-compose`, Debian bookworm's); `make compose` takes COMPOSE.
TOOLS = {"v2": ["docker", "compose"], "1.29": ["docker-compose"]}


@pytest.fixture(scope="module", params=list(TOOLS))
def compose(request: pytest.FixtureRequest, dockerd: None,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Compose]:
    tool = TOOLS[request.param]
    version = _run(*tool, "version", cwd=REPO, env=dict(os.environ)).stdout
    assert ("version 2." in version) == (request.param == "v2"), version
    root = tmp_path_factory.mktemp("compose") / "doq"
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    for rel in listed.splitlines():
        source = REPO / rel
        if source.is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / rel)
    (root / ".venv").symlink_to(REPO / ".venv")
    ports = free_ports(6)
    project = f"doqtest{os.getpid()}v{request.param.replace('.', '')}"
    env = dict(os.environ, COMPOSE_PROJECT_NAME=project, DOQ_IMAGE=f"doq:{project}",
               COMPOSE=" ".join(tool),
               **{f"DOQ_HTTP_PORT_{i}": str(ports[i]) for i in range(3)},
               **{f"DOQ_GRPC_PORT_{i}": str(ports[3 + i]) for i in range(3)})
    *setup, up = _readme_commands()
    printed = ""
    for command in setup:
        printed += _run("sh", "-c", command, cwd=root, env=env).stdout
    key = re.search(r"\bdoq_[A-Za-z0-9_-]{20,}", printed)
    assert key, printed
    for name in ("doq-cluster-secret", "doq-keys.yaml"):
        assert (root / name).stat().st_mode & 0o777 == 0o600, name
        os.chown(root / name, HOST_USER, HOST_USER)
    cluster = Compose(root, env, key[0], ports[:3], ports[3:], tool)
    try:
        _run("sh", "-c", up, cwd=root, env=env, timeout=900)
        yield cluster
    finally:
        for node in NODES:
            logs = _run(*cluster.tool, "logs", "--no-color", node, cwd=root, env=env,
                        check=False)
            (root / f"{node}.log").write_text(logs.stdout + logs.stderr)
        _run(*cluster.tool, "down", "-v", "--timeout", "15", cwd=root, env=env,
             timeout=300, check=False)
        _run("docker", "image", "rm", "-f", f"doq:{project}", cwd=root, env=env, check=False)


def _all_healthy(c: Compose, seconds: float = 120) -> None:
    _eventually("three healthy nodes", seconds,
                lambda: all(c.health(n) == "healthy" for n in NODES))


def _count(c: Compose, index: int, queue: str) -> int:
    status, body = c.request(index, "GET", f"/API/v1/queues/{queue}")
    assert status == 200, body
    return int(body["ready"]) + int(body["unacked"])


def test_three_nodes_healthy_and_any_port_serves_the_cluster(compose: Compose) -> None:
    _all_healthy(compose)
    status, _ = compose.request(0, "POST", "/API/v1/queues",
                                {"name": "orders", "type": "delayed"})
    assert status in (200, 201), status
    status, body = compose.request(1, "POST", "/API/v1/queues/orders/messages",
                                   {"content": "first", "priority": 1})
    assert status in (200, 201), body
    # node-2 may not have applied the enqueue yet: a follower answers "empty" from its own
    # state, so the dequeue is tried as a consumer would, until it is there
    taken = _eventually("the message through node-2", 10, lambda: (
        lambda got: got[1] if got[0] == 200 else None)(
        compose.request(2, "GET", "/API/v1/queues/orders/messages?ack=true")))
    assert taken["content"] == "first", taken
    # The listing names the published addresses, which the host can reach.
    status, body = compose.request(1, "GET", "/API/v1/cluster/servers")
    listed = {s["id"]: (s["http_addr"], s["grpc_addr"]) for s in body["servers"]}
    assert listed == {n: (f"127.0.0.1:{compose.http[i]}", f"127.0.0.1:{compose.grpc[i]}")
                      for i, n in enumerate(NODES)}


def test_the_host_tools_work_from_one_published_url(compose: Compose,
                                                    tmp_path: Path) -> None:
    leader = compose.leader(0)
    follower = next(i for i, n in enumerate(NODES) if n != leader)
    url = compose.url(follower)
    doq = [str(REPO / ".venv" / "bin" / "python"), str(REPO / "doq.py")]
    env = dict(os.environ)

    sync_http = connect(url, api_key=compose.key)
    sync_grpc = connect(url, transport="grpc", api_key=compose.key)
    sync_http.create_queue("tools")
    for i in range(5):
        sync_http.enqueue("tools", f"http-{i}")
        sync_grpc.enqueue("tools", f"grpc-{i}")

    full = tmp_path / "full.bak"
    done = _run(*doq, "backup", "--url", url, "--output", str(full), "--api-key",
                compose.key, cwd=tmp_path, env=env)
    since = done.stdout.strip().splitlines()[-1]
    assert since.isdigit(), done.stdout
    sync_http.enqueue("tools", "after the full backup")
    incremental = tmp_path / "incr.bak"
    _run(*doq, "backup", "--url", url, "--output", str(incremental), "--since", since,
         "--api-key", compose.key, cwd=tmp_path, env=env)
    sync_http.purge("tools")
    _run(*doq, "restore", "--url", url, "--full", str(full), "--incremental",
         str(incremental), "--api-key", compose.key, cwd=tmp_path, env=env, timeout=300)
    _eventually("the restored messages on the follower", 10,
                lambda: _count(compose, follower, "tools") == 11)

    async def through_asyncio() -> list[str]:
        out = []
        for transport in ("http", "grpc"):
            client = await connect_async(url, transport=transport, api_key=compose.key)
            try:
                msg = await client.dequeue("tools", ack=True)
                out.append(msg.content)
            finally:
                await client.close()
        return out

    taken = asyncio.run(through_asyncio())
    taken += [sync_grpc.dequeue("tools", ack=True).content,
              sync_http.dequeue("tools", ack=True).content]
    assert len(set(taken)) == 4
    sync_http.close()
    sync_grpc.close()

    # doq worker, given the one URL, runs tasks sent from the host
    (tmp_path / "compose_tasks.py").write_text(TASKS.format(url=url, key=compose.key,
                                                            log=str(tmp_path / "ran")))
    worker = subprocess.Popen(
        [*doq, "worker", "compose_tasks:app", "--queues", "work", "--concurrency", "4"],
        cwd=tmp_path, env={**env, "PYTHONPATH": f"{tmp_path}:{REPO}"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        sys.path.insert(0, str(tmp_path))
        sys.modules.pop("compose_tasks", None)     # each Compose generation writes its own
        import compose_tasks  # noqa: PLC0415 - written above
        for n in range(10):
            compose_tasks.note.send(n)
        _eventually("10 tasks run by the worker", 60, lambda: (tmp_path / "ran").exists()
                    and sorted((tmp_path / "ran").read_text().split()) ==
                    sorted(str(n) for n in range(10)))
    finally:
        sys.path.remove(str(tmp_path))
        worker.terminate()
        assert worker.wait(timeout=60) == 0

    # doq tui's cluster screen sees the three nodes up through the published addresses
    async def console() -> list[list[str]]:
        app = DoqConsole([url], refresh_every=0.5, security=Security(api_key=compose.key))
        async with app.run_test(size=(130, 30)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, QueuesScreen), what="queues")
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ClusterScreen), what="cluster")
            await until(pilot, lambda: len(rows(app, "#nodes")) == 3 and
                        all("up" in r[2] for r in rows(app, "#nodes")), 30, what="3 nodes up")
            seen = rows(app, "#nodes")
            await pilot.press("q")
            return seen

    seen = asyncio.run(console())
    assert sorted(r[0] for r in seen) == list(NODES)
    assert [r[0] for r in seen if "leader" in r[1]] == [compose.leader(follower)]


def test_writes_go_on_within_5_s_of_a_leader_kill_and_its_data_comes_back(
        compose: Compose) -> None:
    compose.request(0, "POST", "/API/v1/queues", {"name": "kept", "type": "delayed"})
    for i in range(20):
        status, body = compose.request(i % 3, "POST", "/API/v1/queues/kept/messages",
                                       {"content": f"m{i}", "priority": 0})
        assert status in (200, 201), body
    leader = compose.leader(0)
    others = [i for i, n in enumerate(NODES) if n != leader]
    _run("docker", "kill", compose.container(leader), cwd=compose.root, env=compose.env)
    killed = time.monotonic()

    def write() -> bool:
        status, _ = compose.request(others[0], "POST", "/API/v1/queues/kept/messages",
                                    {"content": "after the kill", "priority": 0}, timeout=2)
        return status in (200, 201)

    _eventually("a write after the leader kill", 5, write)
    assert time.monotonic() - killed < 5
    _eventually("the other follower names the new leader", 5,
                lambda: compose.leader(others[1]) != leader)
    _run(*compose.tool, "start", leader, cwd=compose.root, env=compose.env)
    _all_healthy(compose)
    back = compose.index(leader)
    _eventually("the restarted node's data", 30, lambda: _count(compose, back, "kept") == 21)


def test_down_then_up_keeps_every_message(compose: Compose) -> None:
    before = _count(compose, compose.index(compose.leader(0)), "kept")     # all acked ones
    compose("down", "--timeout", "15")
    compose("up", "-d")
    _all_healthy(compose)
    for i in range(3):
        _eventually(f"node-{i}'s messages", 30,
                    lambda i=i: _count(compose, i, "kept") == before)


def test_a_graceful_stop_hands_leadership_over(compose: Compose) -> None:
    leader = compose.leader(0)
    others = [i for i, n in enumerate(NODES) if n != leader]
    compose("stop", "--timeout", "15", leader)
    logs = _run(*compose.tool, "logs", "--no-color", leader, cwd=compose.root,
                env=compose.env).stdout
    assert "leadership handed over to" in logs, logs[-3000:]
    new = _eventually("a new leader", 5, lambda: (
        lambda named: named if named != leader else None)(compose.leader(others[0])))
    assert new in NODES
    status, body = compose.request(others[1], "POST", "/API/v1/queues/kept/messages",
                                   {"content": "after the stop", "priority": 0})
    assert status in (200, 201), body
    compose("start", leader)
    _all_healthy(compose)
