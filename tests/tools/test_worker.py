"""Tasks and ``doq worker`` against a real node: sending (delays, groups, dedup keys), runs
that succeed, fail and are retried with back-off, are dead-lettered when their retries are
spent or at once (Reject), follow-ups stored with the ack, a long task's lease kept, a task
past its timeout abandoned, and the command's stop on SIGTERM within its grace."""
from __future__ import annotations

import collections
import datetime as dt
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from doq_lib.client import connect
from doq_lib.errors import InvalidArgument
from doq_lib.tasks import App, Reject, current, envelope, read_envelope
from doq_lib.worker import Worker, load_app
from tests.harness import REPO, Cluster, NodeProc, free_ports, wait_until

_n = itertools.count()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    c = Cluster(str(tmp_path_factory.mktemp("worker")), size=1,
                flags={"grpc.address": "127.0.0.1:0"}).start()
    try:
        yield c.nodes[0]
    finally:
        c.stop()


def url(node: NodeProc) -> str:
    return f"http://127.0.0.1:{node.http_port}"


class Running:
    """A worker on its own thread, stopped on leaving the block."""

    def __init__(self, app: App, queues: list[str], concurrency: int = 4,
                 grace: float = 5.0) -> None:
        self.worker = Worker(app, queues, concurrency, grace)
        self.thread = threading.Thread(target=self.worker.run, kwargs={"install_signals": False},
                                       daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *_: Any) -> None:
        self.worker.stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def test_the_envelope_is_plain_json_and_checked() -> None:
    text = envelope("m.f", [1, "a"], {"k": [2]})
    assert text == '{"doq_task":1,"task":"m.f","args":[1,"a"],"kwargs":{"k":[2]}}'
    assert read_envelope(text).kwargs == {"k": [2]}
    for bad in ("nope", "[]", '{"doq_task": 2, "task": "x"}', '{"doq_task": 1}',
                '{"doq_task": 1, "task": "x", "args": {}}'):
        with pytest.raises(InvalidArgument):
            read_envelope(bad)


def test_tasks_run_retry_dead_letter_and_hand_on(node: NodeProc) -> None:
    app = App(url(node))
    queue = f"jobs{next(_n)}"
    done: list[Any] = []
    tries: collections.Counter[int] = collections.Counter()

    @app.task(queue=queue)
    def record(n: int, tag: str = "") -> None:
        done.append((n, tag))

    @app.task(queue=queue, retries=3, backoff=(0, 0))
    def flaky(n: int) -> None:
        tries[n] += 1
        if tries[n] < 3:
            raise ConnectionError(f"try {tries[n]}")
        done.append(("flaky", n))

    @app.task(queue=queue, retries=2, backoff=(0, 0))
    def broken() -> None:
        raise ValueError("always")

    @app.task(queue=queue)
    def poison() -> None:
        raise Reject("bad input")

    @app.task(queue=queue, name="chain.first")
    def first(n: int) -> None:
        current().then(record, n * 10, tag="from first")

    for n in range(20):
        record.send(n)
    flaky.send(1)
    broken.send()
    poison.send()
    first.send(4)
    with Running(app, [queue]) as worker:
        wait_until(lambda: len(done) >= 22 and worker.counts["dead_lettered"] >= 2, 30)
    assert sorted(d for d in done if d[1] == "") == [(n, "") for n in range(20)]
    assert ("flaky", 1) in done and tries[1] == 3
    assert (40, "from first") in done
    client = app.client
    assert client.queue(queue).total == 0
    dead = client.dequeue_many(queue + ".dead", 10)
    errors = sorted(m.metadata["x-last-error"] for m in dead)
    assert errors == ["Reject: bad input", "ValueError: always"]
    broken_one = next(m for m in dead if "always" in m.metadata["x-last-error"])
    assert broken_one.metadata["x-deliveries"] == "3"          # the run and two retries
    reasons = {m.metadata["x-last-error"]: m.metadata["x-dead-reason"] for m in dead}
    assert reasons == {"Reject: bad input": "rejected", "ValueError: always": "retries_spent"}
    assert worker.counts["retried"] == 2 + 2 and worker.counts["succeeded"] == 23
    app.close()


def test_sending_with_delays_groups_and_keys(node: NodeProc) -> None:
    app = App(url(node))
    queue = f"send{next(_n)}"

    @app.task(queue=queue, group=lambda tenant, job: f"tenant.{tenant}", priority=3)
    def job(tenant: str, job: int) -> None:
        pass

    later = job.send_in(60, "acme", 1)
    now = job.send_at(dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5), "globex", 2)
    client = app.client
    assert client.explain(queue, later).reasons[0]["code"] == "delayed_until"
    taken = client.dequeue(queue, ack=True)
    assert (taken.id, taken.group, taken.metadata["doq-task"]) == (now, "tenant.globex",
                                                                   job.name)
    assert read_envelope(taken.content).args == ["globex", 2]
    with pytest.raises(InvalidArgument):
        job.send_at(dt.datetime(2030, 1, 1), "naive", 3)
    with pytest.raises(InvalidArgument):
        job.send_in(31 * 86400, "too", 4)
    client.update_queue(queue, dedup_window=60)
    first = job.send_with(("acme", 5), dedup_key="job-5")
    assert job.send_with(("acme", 5), dedup_key="job-5") == first     # seen: not stored again
    app.close()


def test_a_long_task_keeps_its_lease_and_one_past_its_timeout_is_abandoned(
        node: NodeProc) -> None:
    app = App(url(node))
    queue = f"slow{next(_n)}"
    app.ensure_queue(queue)
    with connect(f"grpc://{node.status()['grpc_addr']}") as admin:
        admin.update_queue(queue, ack_timeout=10)            # gRPC allows 10 s
    finished: list[str] = []

    @app.task(queue=queue)
    def long(seconds: float) -> None:
        time.sleep(seconds)
        finished.append("long")

    @app.task(queue=queue, timeout=1, retries=0)
    def stuck() -> None:
        time.sleep(4)
        finished.append("stuck")

    long.send(12)                                            # past the 10 s lease
    stuck.send()
    with Running(app, [queue], concurrency=2, grace=15) as worker:
        wait_until(lambda: "long" in finished, 40)
    assert worker.counts["succeeded"] == 1 and worker.counts["abandoned"] == 1
    dead = app.client.dequeue(queue + ".dead", ack=True)
    assert "TimeoutError: timed out after 1 s" in dead.metadata["x-last-error"]
    assert app.client.queue(queue).total == 0                # the long one: acked once
    app.close()


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_the_command_stops_on_sigterm_within_its_grace(node: NodeProc, tmp_path: Path,
                                                       pool: str) -> None:
    queue = f"term{next(_n)}"
    marks = tmp_path / "marks"
    (tmp_path / f"termtasks_{pool}.py").write_text(
        "import time\n"
        "from doq_lib.tasks import App\n"
        f"app = App({url(node)!r})\n"
        f"@app.task(queue={queue!r}, name='nap')\n"
        "def nap(n):\n"
        f"    open({str(marks)!r}, 'a').write(f'start {{n}}\\n')\n"
        "    time.sleep(1.5)\n"
        f"    open({str(marks)!r}, 'a').write(f'end {{n}}\\n')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        app = load_app(f"termtasks_{pool}:app")
        for n in range(8):
            app.tasks["nap"].send(n)
    finally:
        sys.path.remove(str(tmp_path))
    port = free_ports(1)[0]
    proc = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "doq.py"), "worker", f"termtasks_{pool}:app",
         "--queues", queue, "--concurrency", "2", "--grace", "10", "--pool", pool,
         "--metrics", f"127.0.0.1:{port}"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": REPO}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: marks.exists() and marks.read_text().count("start") >= 2, 30)
        metrics = wait_until(lambda: _scrape(port), 10)
        assert metrics['doq_worker_tasks_started_total{task="nap"}'] >= 2
        assert 0 <= metrics["doq_worker_tasks_in_flight"] <= 2          # at most --concurrency
        wait_until(lambda: "end" in marks.read_text(), 10)
        wait_until(lambda: all((_scrape(port) or {}).get(name, 0) >= 1 for name in (
            'doq_worker_task_duration_seconds_count{task="nap"}',
            'doq_worker_tasks_succeeded_total{task="nap"}')), 10)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    lines = marks.read_text().split()
    started = {lines[i + 1] for i in range(0, len(lines), 2) if lines[i] == "start"}
    ended = {lines[i + 1] for i in range(0, len(lines), 2) if lines[i] == "end"}
    assert started == ended                    # every task it started, it let finish
    info = app.client.queue(queue)
    assert (info.unacked, info.total) == (0, 8 - len(ended)), (info, out[-1500:])
    assert "worker stopped" in out
    app.close()


def _scrape(port: int) -> dict[str, float] | None:
    """The worker's metrics as name{labels} -> value (None: not served yet)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_the_asyncio_pool_awaits_tasks_together_and_interrupts_at_the_timeout(
        node: NodeProc) -> None:
    import asyncio

    app = App(url(node))
    queue = f"aio{next(_n)}"
    state = {"now": 0, "most": 0, "done": 0, "plain": 0}

    @app.task(queue=queue)
    async def nap(n: int) -> None:
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        await asyncio.sleep(0.3)
        state["now"] -= 1
        state["done"] += 1
        if n == 0:
            current().then(plain, "after nap 0")

    @app.task(queue=queue)
    def plain(tag: str) -> None:               # a plain function on the asyncio pool
        state["plain"] += 1

    @app.task(queue=queue, timeout=0.5, retries=0)
    async def stuck() -> None:
        await asyncio.sleep(30)

    for n in range(30):
        nap.send(n)
    stuck.send()
    worker = Worker(app, [queue], concurrency=30, grace=5, pool="asyncio")
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False},
                              daemon=True)
    thread.start()
    try:
        wait_until(lambda: state["done"] == 30 and state["plain"] == 1 and
                   worker.counts["dead_lettered"] == 1, 30)
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert state["most"] >= 10                  # awaited together on one loop
    dead = app.client.dequeue(queue + ".dead", ack=True)
    assert "timed out after 0.5 s (interrupted)" in dead.metadata["x-last-error"]
    assert worker.counts["abandoned"] == 0 and app.client.queue(queue).total == 0
    with pytest.raises(InvalidArgument, match="--pool"):
        Worker(app, [queue], pool="forks")
    with pytest.raises(InvalidArgument, match="module:attribute"):
        Worker(app, [queue], pool="processes")
    app.close()


def test_the_processes_pool_runs_tasks_in_children_and_ends_one_past_its_timeout(
        node: NodeProc, tmp_path: Path) -> None:
    """``--pool processes``: runs happen in child processes (not the worker's), failures and
    rejects come back with their text, follow-ups are stored with the ack, a run past its
    timeout is interrupted (its process ended: it never writes its end mark) and a child
    that dies fails its run; the pool goes on with new children."""
    queue = f"proc{next(_n)}"
    marks = tmp_path / "marks"
    (tmp_path / "proctasks.py").write_text(
        "import os, time\n"
        "from doq_lib.tasks import App, Reject, current\n"
        f"app = App({url(node)!r})\n"
        f"MARKS = {str(marks)!r}\n"
        "def mark(text):\n"
        "    with open(MARKS, 'a') as f:\n"
        "        f.write(f'{text} {os.getpid()}\\n')\n"
        f"@app.task(queue={queue!r})\n"
        "def work(n):\n"
        "    mark(f'work-{n}')\n"
        f"@app.task(queue={queue!r}, retries=1, backoff=(0, 0))\n"
        "def broken():\n"
        "    mark('broken')\n"
        "    raise ValueError('always')\n"
        f"@app.task(queue={queue!r})\n"
        "def poison():\n"
        "    raise Reject('bad input')\n"
        f"@app.task(queue={queue!r}, timeout=1, retries=0)\n"
        "def stuck():\n"
        "    mark('stuck-start')\n"
        "    time.sleep(6)\n"
        "    mark('stuck-end')\n"
        f"@app.task(queue={queue!r}, retries=0)\n"
        "def crash():\n"
        "    os._exit(3)\n"
        f"@app.task(queue={queue!r})\n"
        "def chain(n):\n"
        "    current().then(work, n + 100)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        app = load_app("proctasks:app")
        tasks = app.tasks
        for n in range(12):
            tasks["proctasks.work"].send(n)
        for name in ("broken", "poison", "stuck", "crash"):
            tasks[f"proctasks.{name}"].send()
        tasks["proctasks.chain"].send(1)
        worker = Worker(app, [queue], concurrency=3, grace=5, pool="processes",
                        spec="proctasks:app")
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False},
                                  daemon=True)
        thread.start()
        try:
            wait_until(lambda: worker.counts["succeeded"] == 14 and
                       worker.counts["dead_lettered"] == 4, 60)
        finally:
            worker.stop()
            thread.join(timeout=30)
    finally:
        sys.path.remove(str(tmp_path))
    assert not thread.is_alive()
    lines = [line.split() for line in marks.read_text().splitlines()]
    works = sorted(int(text[5:]) for text, _ in lines if text.startswith("work-"))
    assert works == list(range(12)) + [101]
    pids = {int(pid) for _, pid in lines}
    assert os.getpid() not in pids                       # never in the worker's process
    assert [text for text, _ in lines].count("broken") == 2   # the run and one retry
    time.sleep(6)
    assert "stuck-end" not in marks.read_text()           # its process was ended
    stuck_pid = next(int(pid) for text, pid in lines if text == "stuck-start")
    with pytest.raises(ProcessLookupError):
        os.kill(stuck_pid, 0)
    dead = {m.metadata["x-last-error"] for m in app.client.dequeue_many(queue + ".dead", 10,
                                                                         ack=True)}
    assert dead == {"ValueError: always", "Reject: bad input",
                    "TimeoutError: timed out after 1 s (interrupted)",
                    "the process running it ended (exit code 3)"}, dead
    assert app.client.queue(queue).total == 0
    assert worker.counts["abandoned"] == 0
    app.close()


def test_one_slot_serves_two_queues(node: NodeProc) -> None:
    """Concurrency 1 on two queues, one of them idle: every task of the busy one runs (a
    consumer that held the only slot while it waited on the idle queue starved the other)."""
    app = App(url(node))
    busy, idle = f"busy{next(_n)}", f"idle{next(_n)}"
    done: list[int] = []

    @app.task(queue=busy)
    def work(n: int) -> None:
        done.append(n)

    app.ensure_queue(idle)
    for n in range(10):
        work.send(n)
    with Running(app, [idle, busy], concurrency=1):
        wait_until(lambda: len(done) == 10, 20)
    assert sorted(done) == list(range(10))
    app.close()


def test_prefetched_messages_keep_their_leases(node: NodeProc) -> None:
    """One slot, prefetch 6, a 10 s lease, six 3 s tasks taken at once: the last waits in the
    consumer ~12 s before its turn, past its whole lease; it is touched while it waits, so
    each runs once, on its first delivery."""
    app = App(url(node))
    queue = f"held{next(_n)}"
    app.ensure_queue(queue)
    with connect(f"grpc://{node.status()['grpc_addr']}") as admin:
        admin.update_queue(queue, ack_timeout=10)            # gRPC allows 10 s
    runs: list[tuple[int, int]] = []

    @app.task(queue=queue)
    def slow(n: int) -> None:
        runs.append((n, current().message.deliveries))
        time.sleep(3)

    for n in range(6):
        slow.send(n)
    worker = Worker(app, [queue], concurrency=1, grace=10, prefetch=6)
    assert worker.prefetch == 6 and Worker(app, [queue], concurrency=3).prefetch == 12
    with pytest.raises(InvalidArgument, match="prefetch"):
        Worker(app, [queue], prefetch=1001)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False},
                              daemon=True)
    thread.start()
    try:
        wait_until(lambda: worker.counts["succeeded"] == 6, 60)
        time.sleep(1)
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert sorted(runs) == [(n, 1) for n in range(6)], runs
    assert app.client.queue(queue).total == 0
    app.close()


def test_an_app_that_is_not_there_is_named(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`doq worker tasks:nothere` says that tasks has no nothere; an attribute of another
    type says what it is."""
    (tmp_path / "named_tasks.py").write_text("from doq_lib.tasks import App\n"
                                             "app = App('http://127.0.0.1:1')\nother = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InvalidArgument) as missing:
        load_app("named_tasks:nothere")
    assert str(missing.value) == "named_tasks:nothere: named_tasks has no 'nothere'"
    with pytest.raises(InvalidArgument) as wrong:
        load_app("named_tasks:other")
    assert str(wrong.value) == \
        "named_tasks:other: named_tasks.other is a int, not a doq_lib.tasks.App"
    assert load_app("named_tasks:app").urls == "http://127.0.0.1:1"
