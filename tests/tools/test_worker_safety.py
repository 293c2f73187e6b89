"""A worker never loops on a message and never outlives its stop: on every pool, a message it
cannot read (nested too deep, not an envelope of version 1, an error text past what a settle
carries) is dead-lettered at once with the reason; a task that raises SystemExit,
KeyboardInterrupt, GeneratorExit or any BaseException, or an exception whose text cannot be
read, is a failure like any other (retried, then dead-lettered) and the worker goes on; after
SIGTERM it exits within its grace even with an abandoned task thread; children of the
processes pool end with a worker killed -9; clients of consumers that ended are closed."""
from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from doq_lib.client import connect
from doq_lib.tasks import App, envelope
from doq_lib.worker import Worker, load_app
from tests import harness
from tests.harness import REPO, Cluster, NodeProc, wait_until
from tests.tools.test_worker import url

_n = itertools.count()

TASKS = '''
import os, sys, time
from doq_lib.tasks import App

app = App({url!r})
QUEUE = {queue!r}


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text")


class Custom(BaseException):
    pass


RAISES = {{"exit": SystemExit(3), "interrupt": KeyboardInterrupt(), "generator": GeneratorExit(),
          "custom": Custom("mine"), "unprintable": Unprintable(),
          "long": ValueError("\u00e9" * 5000)}}


@app.task(queue=QUEUE, name="raise", retries=1, backoff=(0, 0))
def raises(kind):
    raise RAISES[kind]


@app.task(queue=QUEUE, name="ok")
def ok(n):
    open({marks!r}, "a").write(f"ok {{n}}\\n")


@app.task(queue=QUEUE, name="nap", timeout=1, backoff=(600, 600))
def nap(seconds):
    open({marks!r}, "a").write(f"nap {{os.getpid()}}\\n")
    time.sleep(seconds)
    open({marks!r}, "a").write("woke\\n")
'''


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with harness.running(str(tmp_path_factory.mktemp("worker-safety")),
                         flags={"grpc.address": "127.0.0.1:0"}) as c:
        yield c.nodes[0]


def tasks_module(node: NodeProc, root: Path) -> tuple[str, str, Path]:
    """A module of tasks in ``root`` (importable by child processes): (its app's
    module:attribute, its queue, the file its tasks write marks to)."""
    n = next(_n)
    queue, marks = f"safe{n}", root / f"marks{n}"
    (root / f"safetasks{n}.py").write_text(TASKS.format(url=url(node), queue=queue,
                                                        marks=str(marks)))
    return f"safetasks{n}:app", queue, marks


@pytest.fixture()
def importable(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{tmp_path}:{REPO}" + (f":{old}" if old else "")
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        os.environ["PYTHONPATH"] = old


def running(app: App, spec: str, queue: str, pool: str) -> tuple[Worker, threading.Thread]:
    worker = Worker(app, [queue], concurrency=2, grace=5, pool=pool, spec=spec)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False},
                              daemon=True)
    thread.start()
    return worker, thread


def stopped(worker: Worker, thread: threading.Thread) -> None:
    worker.stop()
    thread.join(timeout=30)
    assert not thread.is_alive()


UNREADABLE = {
    "deep array": "[" * 100_000,
    "deep args": '{"doq_task": 1, "task": "ok", "args": ' + "[" * 50_000 + "]" * 50_000 + "}",
    "version true": '{"doq_task": true, "task": "ok", "args": [1]}',
    "version 1.0": '{"doq_task": 1.0, "task": "ok", "args": [1]}',
    "long unknown task": json.dumps({"doq_task": 1, "task": "\u00fc" * 3000}),
    "surrogate task": '{"doq_task": 1, "task": "\\ud800x"}',
}


@pytest.mark.parametrize("pool", ["threads", "asyncio", "processes"])
def test_a_message_the_worker_cannot_read_is_dead_lettered_at_once(
        node: NodeProc, importable: Path, pool: str) -> None:
    spec, queue, marks = tasks_module(node, importable)
    app = load_app(spec)
    app.ensure_queue(queue)
    client = connect(url(node))
    for content in UNREADABLE.values():
        client.enqueue(queue, content, priority=1)
    app.tasks["ok"].send(1)
    worker, thread = running(app, spec, queue, pool)
    try:
        wait_until(lambda: worker.counts["dead_lettered"] == len(UNREADABLE) and
                   marks.exists(), 60)
        time.sleep(1.0)
    finally:
        stopped(worker, thread)
    dead = client.dequeue_many(queue + ".dead", 20, ack=True)
    assert len(dead) == len(UNREADABLE) and all(m.deliveries == 1 for m in dead)
    assert {m.metadata["x-dead-reason"] for m in dead} == {"unreadable"}
    reasons = {m.content: m.metadata["x-last-error"] for m in dead}
    assert "nested too deeply" in reasons[UNREADABLE["deep array"]]
    assert "nested too deeply" in reasons[UNREADABLE["deep args"]]
    assert "version 1" in reasons[UNREADABLE["version true"]]
    assert "unknown task" in reasons[UNREADABLE["long unknown task"]]
    assert len(reasons[UNREADABLE["long unknown task"]].encode()) <= 4096
    info = client.queue(queue)
    assert (info.total, info.unacked) == (0, 0) and marks.read_text() == "ok 1\n"
    client.close()
    app.close()


@pytest.mark.parametrize("pool", ["threads", "asyncio", "processes"])
def test_a_task_raising_any_base_exception_fails_like_any_other(
        node: NodeProc, importable: Path, pool: str) -> None:
    spec, queue, marks = tasks_module(node, importable)
    app = load_app(spec)
    kinds = ["exit", "interrupt", "generator", "custom", "unprintable", "long"]
    for kind in kinds:
        app.tasks["raise"].send(kind)
    worker, thread = running(app, spec, queue, pool)
    try:
        wait_until(lambda: worker.counts["dead_lettered"] == len(kinds), 60)
        app.tasks["ok"].send(2)                          # it goes on
        wait_until(marks.exists, 30)
    finally:
        stopped(worker, thread)
    assert worker.counts["retried"] == len(kinds)        # each ran twice, then dead-lettered
    client = connect(url(node))
    dead = client.dequeue_many(queue + ".dead", 20, ack=True)
    errors = sorted(m.metadata["x-last-error"].split(":")[0] for m in dead)
    assert errors == sorted(["SystemExit", "KeyboardInterrupt", "GeneratorExit", "Custom",
                             "Unprintable", "ValueError"])
    assert all(m.metadata["x-deliveries"] == "2" for m in dead)
    assert {m.metadata["x-dead-reason"] for m in dead} == {"retries_spent"}
    assert client.queue(queue).total == 0
    client.close()
    app.close()


def test_sigterm_ends_the_worker_within_its_grace_with_an_abandoned_thread(
        node: NodeProc, importable: Path) -> None:
    spec, queue, marks = tasks_module(node, importable)
    app = load_app(spec)
    app.tasks["nap"].send(120)                           # timeout 1 s: abandoned, sleeps on
    proc = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "doq.py"), "worker", spec, "--queues", queue,
         "--concurrency", "2", "--grace", "2"], cwd=importable, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        # Its timeout abandons the thread (the retry waits 600 s, so nothing else runs).
        wait_until(lambda: "timed out after 1 s: abandoned" in "".join(lines), 30)
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - asked
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert took < 2 + 5, (took, out[-2000:])
    assert "SIGTERM: stopping; 0 running" in out and "abandoned task(s)" in out, out[-2000:]
    app.close()


def test_children_of_the_processes_pool_end_with_a_worker_killed_9(
        node: NodeProc, importable: Path) -> None:
    spec, queue, marks = tasks_module(node, importable)
    app = load_app(spec)
    app.tasks["nap"].send(120)
    proc = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "doq.py"), "worker", spec, "--queues", queue,
         "--concurrency", "1", "--pool", "processes"], cwd=importable,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: marks.exists() and "nap" in marks.read_text(), 60)
        child = int(marks.read_text().split()[1])
        assert child != proc.pid
        proc.kill()
        proc.wait(timeout=10)
        wait_until(lambda: not os.path.exists(f"/proc/{child}") or
                   open(f"/proc/{child}/stat").read().split()[2] == "Z", 10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "woke" not in marks.read_text()
    app.close()


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_worker_through_twenty_failovers_keeps_its_sockets_flat(
        tmp_path: Path) -> None:
    """A worker on a 3-node cluster through 20 leader kills: each time its consumer's node
    goes away the consumer opens a new client; the one it replaces (with its connections to
    the nodes that stayed) is closed once nothing settles through it, so the worker's open
    files stay flat."""
    c = Cluster(str(tmp_path / "cluster"), size=3).start()
    app = App([f"http://127.0.0.1:{n.http_port}" for n in c.nodes])
    queue = "failovers"
    done: list[int] = []

    @app.task(queue=queue)
    def record(n: int) -> None:
        done.append(n)

    worker = Worker(app, [queue], concurrency=2, grace=5)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False},
                              daemon=True)
    try:
        app.ensure_queue(queue)
        thread.start()
        counts = []
        for n in range(21):
            record.send(n)
            wait_until(lambda: n in done, 60)  # noqa: B023 - waited for at once
            time.sleep(1.5)                      # a look at retired clients (WATCH_EVERY)
            counts.append(_open_files())
            leader = c.leader()
            leader.kill()
            c.leader(timeout=30)
            leader.start()
            c.wait_ready(60)
        record.send(99)
        wait_until(lambda: 99 in done, 60)
        assert max(counts[1:]) - counts[1] <= 2, counts          # (one in flight at most)
    finally:
        worker.stop()
        thread.join(timeout=30)
        app.close()
        c.stop()


def test_the_envelope_version_is_the_integer_one() -> None:
    from doq_lib.errors import InvalidArgument
    from doq_lib.tasks import read_envelope
    assert read_envelope(envelope("t", [], {})).task == "t"
    for version in ("true", "1.0", '"1"', "[1]", "null"):
        with pytest.raises(InvalidArgument, match="version 1"):
            read_envelope('{"doq_task": ' + version + ', "task": "t"}')
    with pytest.raises(InvalidArgument, match="nested too deeply"):
        read_envelope("[" * 100_000)
