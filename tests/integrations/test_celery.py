"""DOQ as a Celery broker, with the real kombu and celery packages.

First kombu's own API against one node (publish, get, ack, requeue, reject, sizes, purges,
priorities and delays as DOQ stores them); then Celery workers on a 3-node cluster: ordinary
tasks, priorities, a countdown held by DOQ, a worker killed with kill -9 mid-task whose task
runs again once its visibility timeout is over, and the leader killed while tasks run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import kombu  # noqa: E402 - the real package (requirements-dev.txt)
import pytest

import doq_lib.integrations.celery  # noqa: E402,F401 - registers doq://
from doq_lib.client import HttpClient, connect  # noqa: E402
from tests.harness import REPO, Cluster, NodeProc, running, wait_until  # noqa: E402


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with running(str(tmp_path_factory.mktemp("celery-node"))) as c:
        yield c.nodes[0]


def test_the_scheme_is_registered_and_names_the_transport(node: NodeProc) -> None:
    with kombu.Connection(f"doq://127.0.0.1:{node.http_port}") as conn:
        assert conn.transport_cls == "doq"
        assert type(conn.transport).__module__ == "doq_lib.integrations.celery"
        assert conn.transport.implements.exchange_type == frozenset(["direct"])


def test_kombu_publishes_takes_acks_requeues_and_rejects(node: NodeProc) -> None:
    url = f"http://127.0.0.1:{node.http_port}"
    with kombu.Connection(f"doq://127.0.0.1:{node.http_port}",
                          transport_options={"visibility_timeout": 120}) as conn:
        queue = conn.SimpleQueue("kq")
        queue.consumer.qos(prefetch_count=1)          # one taken at a time
        for n in range(3):
            queue.put({"n": n})
        with HttpClient([url]) as doq:
            info = doq.queue("kq")
            assert (info.type.value, info.settings.ack_timeout, info.total) == ("delayed", 120, 3)
            stored = json.loads(doq.get("kq", doq.browse("kq")[0][0].message.id).content)
            assert stored["body"] and stored["properties"]["delivery_info"]["routing_key"] == "kq"
            assert queue.qsize() == 3
            first = queue.get(timeout=5)
            assert first.payload == {"n": 0} and not first.delivery_info["redelivered"]
            first.requeue()                           # given back: delivered again at once
            again = queue.get(timeout=5)
            assert again.payload == {"n": 0} and again.delivery_info["redelivered"]
            assert again.delivery_tag != first.delivery_tag    # a tag per delivery
            again.ack()
            second = queue.get(timeout=5)
            second.reject()                           # no dead-letter queue: dropped
            third = queue.get(timeout=5)
            assert third.payload == {"n": 2}
            assert doq.queue("kq").unacked == 1
            third.ack()                               # sent without waiting, as AMQP's
            wait_until(lambda: doq.queue("kq").total == 0, 10)
            with pytest.raises(queue.Empty):
                queue.get(timeout=1.5)
            queue.put({"n": 9})
            assert queue.clear() == 1 and doq.queue("kq").total == 0
        queue.close()


def test_priorities_and_delays_become_doqs(node: NodeProc) -> None:
    """A higher kombu priority (0-255, as on RabbitMQ) is served first; an eta within 30
    days is a DOQ delay, a later one a priority timestamp; both wait in DOQ."""
    url = f"http://127.0.0.1:{node.http_port}"
    from kombu import Exchange, Producer, Queue

    with kombu.Connection(f"doq://127.0.0.1:{node.http_port}") as conn, \
            HttpClient([url]) as doq:
        exchange = Exchange("kp", type="direct")
        target = Queue("kp", exchange, routing_key="kp")
        producer = Producer(conn.channel(), exchange, auto_declare=True)
        producer.declare()
        target(conn.default_channel).declare()
        soon = time.time() + 60
        far = time.time() + 40 * 86400
        producer.publish({"n": "low"}, routing_key="kp", priority=1, declare=[target])
        producer.publish({"n": "plain"}, routing_key="kp", declare=[target])
        producer.publish({"n": "high"}, routing_key="kp", priority=200, declare=[target])
        producer.publish({"n": "soon"}, routing_key="kp", headers={"eta": iso(soon)})
        producer.publish({"n": "far"}, routing_key="kp", headers={"eta": iso(far)})
        page, _ = doq.browse("kp")
        order = [json.loads(doq.get("kp", b.message.id).content)["headers"].get("eta")
                 for b in page]
        assert len(page) == 5 and order[:3] == [None, None, None]
        held = {json.loads(b.message.content)["headers"]["eta"]:
                (b.message.priority, doq.explain("kp", b.message.id).reasons[0])
                for b in page[3:]}
        assert held[iso(far)][0] == int(far)              # a priority timestamp, > 30 days
        assert held[iso(soon)][0] == 255                  # a DOQ delay
        assert held[iso(soon)][1]["code"] == "delayed_until"
        assert abs(held[iso(soon)][1]["until"] / 1000 - soon) < 2
        assert held[iso(far)][1]["code"] == "delayed_until"
        simple = conn.SimpleQueue(target)
        simple.consumer.qos(prefetch_count=1)
        got = []
        for _ in range(3):
            message = simple.get(timeout=5)
            got.append(message.payload["n"])
            message.ack()
        assert got == ["high", "low", "plain"]
        with pytest.raises(simple.Empty):
            simple.get(timeout=1.5)                   # the delayed two are not due
        simple.close()


def iso(when: float) -> str:
    import datetime as dt
    return dt.datetime.fromtimestamp(when, dt.timezone.utc).isoformat()


# -- Celery workers on a 3-node cluster ------------------------------------------------------------
CELERY_APP = '''
import os, time
import doq_lib.integrations.celery
from celery import Celery

app = Celery("celery_tasks", broker={broker!r})
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1,
                broker_transport_options={options!r},
                broker_connection_retry_on_startup=True)
LOG = {log!r}


def mark(text):
    fd = os.open(LOG + "." + str(os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fd, (text + "\\n").encode())
    os.close(fd)


@app.task(name="record")
def record(n, sent_at=0.0):
    mark("R %s %.3f" % (n, time.time() - sent_at))


@app.task(name="slow")
def slow(n):
    mark("S %s" % n)
    time.sleep(15)
    mark("E %s" % n)
'''


def marks(root: Path) -> dict[int, list[list[str]]]:
    """Per worker pid, the lines its tasks wrote."""
    return {int(p.suffix[1:]): [line.split() for line in p.read_text().splitlines()]
            for p in root.glob("runs.*")}


def test_celery_workers_run_tasks_through_a_kill_and_a_failover(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("celery")
    c = Cluster(str(root / "cluster"), size=3, flags={"grpc.address": "127.0.0.1:0"}).start()
    procs: list[subprocess.Popen[str]] = []
    try:
        first, *others = [f"127.0.0.1:{n.http_port}" for n in c.followers()] + \
            [f"127.0.0.1:{c.leader().http_port}"]
        options = {"nodes": others, "transport": "grpc", "visibility_timeout": 10}
        code = root / "code"
        code.mkdir()
        (code / "celery_tasks.py").write_text(CELERY_APP.format(
            broker=f"doq://{first}", options=options, log=str(root / "runs")))
        sys.path.insert(0, str(code))
        try:
            import celery_tasks  # type: ignore[import-not-found]
        finally:
            sys.path.remove(str(code))
        record, slow = celery_tasks.record, celery_tasks.slow

        def worker(concurrency: int) -> subprocess.Popen[str]:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "celery_tasks", "worker", "--pool",
                 "threads", "-c", str(concurrency), "--without-gossip", "--without-mingle",
                 "--without-heartbeat", "-l", "INFO"],
                cwd=code, env={**os.environ, "PYTHONPATH": f"{REPO}:{code}"}, text=True,
                stdout=subprocess.DEVNULL, stderr=open(root / f"worker{len(procs)}.log", "w"))
            procs.append(proc)
            return proc

        # Priorities and a countdown, taken one at a time by one worker.
        for n in range(3):
            record.apply_async((f"low{n}",), priority=0)
        record.apply_async(("high",), priority=200)
        record.apply_async(("later", time.time()), countdown=3)
        one = worker(1)
        wait_until(lambda: sum(len(v) for v in marks(root).values()) >= 5, 60,
                   describe=lambda: (root / "worker0.log").read_text()[-3000:])
        lines = marks(root)[one.pid]
        assert [ln[1] for ln in lines[:4]] == ["high", "low0", "low1", "low2"], lines
        later = next(ln for ln in lines if ln[1] == "later")
        assert float(later[2]) >= 2.9, later               # DOQ held it until its countdown

        # kill -9 mid-task: the task runs again once its lease is over (the killed worker no
        # longer extends it). The task (15 s) outlives the visibility timeout (10 s): the
        # live worker keeps its lease, so it runs once there, not again every 10 s.
        slow.delay("k")
        wait_until(lambda: any(ln[:2] == ["S", "k"] for ln in marks(root).get(one.pid, [])), 30)
        one.kill()
        one.wait(timeout=10)
        two = worker(4)
        wait_until(lambda: any(ln[:2] == ["E", "k"] for ln in marks(root).get(two.pid, [])),
                   90, describe=lambda: (root / "worker1.log").read_text()[-3000:])
        assert not any(ln[:2] == ["E", "k"] for ln in marks(root)[one.pid])
        time.sleep(12)                                  # a lease lost would show by now
        assert [ln for ln in marks(root)[two.pid] if ln[1] == "k"] == [["S", "k"], ["E", "k"]]
        assert "stale" not in (root / "worker1.log").read_text()

        # 300 tasks while the leader is killed: each runs; only a lost ack repeats one.
        for n in range(300):
            record.delay(f"m{n}")
        wait_until(lambda: sum(ln[1].startswith("m") for ln in marks(root).get(two.pid, []))
                   >= 50, 60)
        leader = c.leader()
        leader.kill()
        c.leader(timeout=30)
        leader.start()
        c.wait_ready(60)
        reader = connect([f"http://127.0.0.1:{c.leader().http_port}"])
        wait_until(lambda: reader.queue("celery").total == 0, 120, describe=c.describe)
        runs: dict[str, int] = {}
        for lines_of in marks(root).values():
            for ln in lines_of:
                if ln[0] == "R" and ln[1].startswith("m"):
                    runs[ln[1]] = runs.get(ln[1], 0) + 1
        assert set(runs) == {f"m{n}" for n in range(300)}
        repeated = [n for n, k in runs.items() if k > 1]
        assert len(repeated) <= 4, repeated                   # prefetch 1 x concurrency 4
        two.send_signal(signal.SIGTERM)
        assert two.wait(timeout=60) == 0
        reader.close()
        c.assert_replicas_identical(timeout=30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        c.stop()


POISON_APP = '''
import doq_lib.integrations.celery
from celery import Celery

app = Celery("poison_tasks", broker={broker!r})
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1,
                broker_connection_retry_on_startup=True)


@app.task(name="ok")
def ok(n):
    open({marks!r}, "a").write("ok %s\\n" % n)
'''


def test_a_message_celery_cannot_read_is_dead_lettered_with_the_reason(
        node: NodeProc, tmp_path: Path) -> None:
    """Messages in a Celery queue that are no kombu message, or whose body Celery cannot
    decode, go to the queue's dead-letter queue with the reason (``unreadable``), once each:
    none crashes the worker, none comes back, none is dropped; a task after them runs."""
    import base64

    url = f"127.0.0.1:{node.http_port}"
    marks = tmp_path / "marks"
    (tmp_path / "poison_tasks.py").write_text(POISON_APP.format(broker=f"doq://{url}",
                                                                marks=str(marks)))
    client = connect(f"http://{url}")
    client.create_queue("celery.dead")
    client.create_queue("celery", dead_letter_queue="celery.dead", ack_timeout=60)
    sys.path.insert(0, str(tmp_path))
    try:
        import poison_tasks  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    poison_tasks.ok.delay(0)
    sample = json.loads(client.dequeue("celery", ack=True).content)     # a real one, to spoil

    def spoiled(**changes: Any) -> str:
        payload = json.loads(json.dumps(sample))
        for key, value in changes.items():
            target, _, name = key.rpartition("__")
            (payload[target] if target else payload)[name.replace("_", "-")
                                                     if not target else name] = value
        return json.dumps(payload)
    cases = {
        "not json": ("not json {", "not a kombu message: JSONDecodeError"),
        "a list": ("[1, 2]", "expected a JSON object"),
        "no headers": (json.dumps({"properties": {}, "body": ""}), "headers: expected"),
        "unknown encoding": (spoiled(properties__body_encoding="rot13"), "rot13"),
        "untrusted type": (spoiled(content_type="application/x-bogus"), "ContentDisallowed"),
        "broken body": (spoiled(body=base64.b64encode(b"{nope").decode()), "DecodeError"),
    }
    for name, (content, _) in cases.items():
        client.enqueue("celery", content, priority=1, metadata={"case": name})
    poison_tasks.ok.delay(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "poison_tasks", "worker", "--pool", "threads",
         "-c", "1", "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": f"{REPO}:{tmp_path}"}, text=True,
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "worker.log", "w"))
    try:
        wait_until(lambda: marks.exists() and "ok 1" in marks.read_text() and
                   client.queue("celery.dead").total == len(cases), 60,
                   describe=lambda: (tmp_path / "worker.log").read_text()[-3000:])
        assert proc.poll() is None, "the worker stopped"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert client.queue("celery").total == 0
    dead = {m.metadata["case"]: m for m in client.dequeue_many("celery.dead", 20, ack=True)}
    assert set(dead) == set(cases)
    for name, (_, says) in cases.items():
        assert dead[name].metadata["x-dead-reason"] == "unreadable", name
        assert says in dead[name].metadata["x-last-error"], (name, dead[name].metadata)
        assert dead[name].deliveries == 1, name
    client.close()
