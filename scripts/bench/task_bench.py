#!/usr/bin/env python3
"""Tasks per second of a no-op task: ``doq worker`` (threads, asyncio) and Celery on DOQ,
against Celery on RabbitMQ quorum queues, in the same run.

    bash ../shared/bench/peers/install_peers.sh
    DOQBENCH_DIR=/tmp/doqbench bash ../shared/bench/peers/start_rabbitmq.sh cluster
    python scripts/bench/task_bench.py --tasks 5000 --rounds 3
    DOQBENCH_DIR=/tmp/doqbench bash ../shared/bench/peers/stop_rabbitmq.sh

Two figures per system, every round:

- ``send``: one sender in one thread sends ``--sends`` calls one after the other
  (``task.send()``; Celery: ``task.delay()`` with publisher confirms on RabbitMQ): calls/s.
- ``drain``: ``--tasks`` calls are stored first, then one worker with ``--concurrency``
  starts; tasks/s from the first run to the last. Each run appends one byte to a file of
  its process, which is how the runs are counted (the same for every system).

DOQ: a fresh 3-node cluster of this checkout (HTTP) for each phase, queues created by the
task API (fair, with a dead-letter queue); each round starts at another phase. Celery:
``task_acks_late``, prefetch multiplier 4 (its default); on RabbitMQ a quorum queue over
the three nodes of ``start_rabbitmq.sh cluster`` with ``confirm_publish``. Bounded: every
phase has a time cap; loopback only; the clusters and the workers are ended by the PIDs this
script started.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import http_bench  # noqa: E402 - the same local cluster

REPO = http_bench.REPO
AMQP = ";".join(f"amqp://guest:guest@127.0.0.1:{p}//" for p in (5672, 5673, 5674))

DOQ_TASKS = '''
import os
from doq_lib.tasks import App
app = App({urls!r})
LOG = os.open({log!r} + "." + str(os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_APPEND)


@app.task(queue={queue!r}, name="noop")
def noop(n):
    os.write(LOG, b"x")


@app.task(queue={queue!r} + "-aio", name="anoop")
async def anoop(n):
    os.write(LOG, b"x")
'''

CELERY_TASKS = '''
import os
{extra}
from celery import Celery
from kombu import Exchange, Queue
app = Celery("bench", broker={broker!r})
app.conf.update(task_acks_late=True, task_default_queue={queue!r},
                broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                broker_transport_options={options!r})
if {quorum!r}:
    app.conf.task_queues = [Queue({queue!r}, Exchange({queue!r}), routing_key={queue!r},
                                  queue_arguments={{"x-queue-type": "quorum"}})]
LOG = os.open({log!r} + "." + str(os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_APPEND)


@app.task(name="noop")
def noop(n):
    os.write(LOG, b"x")
'''


def runs_done(log: str) -> int:
    folder, prefix = os.path.dirname(log), os.path.basename(log) + "."
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
               if f.startswith(prefix))


def drain(log: str, total: int, argv: list[str], cwd: str, env: dict[str, str],
          cap: float) -> float:
    """Start the worker ``argv``; tasks/s from its first run to its ``total``-th."""
    worker = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                              stderr=open(os.path.join(cwd, "worker.log"), "ab"))
    try:
        deadline = time.monotonic() + cap
        first = last = None
        while time.monotonic() < deadline:
            done = runs_done(log)
            now = time.monotonic()
            if first is None and done >= 1:
                first = (now, done)
            if done >= total:
                last = (now, done)
                break
            time.sleep(0.01)
        if first is None or last is None:
            raise SystemExit(f"the worker ran {runs_done(log)} of {total} within {cap} s: "
                             f"see {cwd}/worker.log")
        return (last[1] - first[1]) / max(last[0] - first[0], 1e-6)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)


def wait_ready(urls: list[str], timeout: float = 60) -> None:
    import urllib.request
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(urllib.request.urlopen(f"{u}/readyz", timeout=2).status == 200
                   for u in urls):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the DOQ cluster was not ready within {timeout:g} s")


def timed(fn: Any, count: int) -> float:
    started = time.perf_counter()
    for n in range(count):
        fn(n)
    return count / (time.perf_counter() - started)


def module(work: str, name: str, source: str) -> Any:
    with open(os.path.join(work, name + ".py"), "w") as f:
        f.write(source)
    sys.path.insert(0, work)
    try:
        __import__(name)
        return sys.modules[name]
    finally:
        sys.path.remove(work)


class Fresh:
    """A fresh 3-node DOQ cluster for one phase (no phase runs on another's leftovers)."""

    def __enter__(self) -> http_bench.LocalCluster:
        self.cluster = http_bench.LocalCluster(3, [])
        wait_ready(self.cluster.urls)
        return self.cluster

    def __exit__(self, *_: Any) -> None:
        self.cluster.stop()


def doq_phase(args: argparse.Namespace, n: int, kind: str, work: str,
              env: dict[str, str]) -> dict[str, float]:
    """One sender's sends (threads phase only), then a drain by ``doq worker --pool kind``."""
    out: dict[str, float] = {}
    with Fresh() as cluster:
        log = os.path.join(work, f"doq-{kind}")
        name = f"doq_tasks_{kind}{n}"
        tasks = module(work, name, DOQ_TASKS.format(urls=cluster.urls, log=log, queue="b"))
        app = tasks.app
        task, queue = (tasks.noop, "b") if kind == "threads" else (tasks.anoop, "b-aio")
        app.ensure_queue(queue)
        if kind == "threads":
            out["doq send"] = timed(task.send, args.sends)
        for start in range(0, args.tasks, 1000):
            app.client.enqueue_batch([task.message([i], {}) for i in
                                      range(start, min(start + 1000, args.tasks))])
        waiting = args.tasks + (args.sends if kind == "threads" else 0)
        out[f"doq drain {kind}"] = drain(
            log, waiting,
            [sys.executable, os.path.join(REPO, "doq.py"), "worker", f"{name}:app",
             "--queues", queue, "--concurrency", str(args.concurrency), "--pool", kind],
            work, env, args.cap)
        app.close()
    return out


def celery_phase(args: argparse.Namespace, n: int, label: str, work: str,
                 env: dict[str, str]) -> dict[str, float]:
    """One sender's delay()s, then drains by Celery workers (threads; prefork on RabbitMQ)."""
    with contextlib.ExitStack() as stack:
        if label == "celery-doq":
            cluster = stack.enter_context(Fresh())
            broker = f"doq://{cluster.urls[0].split('://')[1]}"
            options: dict[str, Any] = {"nodes": [u.split("://")[1] for u in cluster.urls[1:]]}
            quorum, extra = False, "import doq_lib.integrations.celery"
        else:
            broker, options, quorum, extra = AMQP, {"confirm_publish": True}, True, ""
        out: dict[str, float] = {}
        log = os.path.join(work, label)
        name = f"{label.replace('-', '_')}{n}"
        celery_tasks = module(work, name, CELERY_TASKS.format(
            extra=extra, broker=broker, queue=f"c{n}", options=options, quorum=quorum,
            log=log))
        out[f"{label} send"] = timed(celery_tasks.noop.delay, args.sends)
        for pool in ("threads", "prefork"):
            if pool == "prefork" and label == "celery-doq" and not args.prefork_doq:
                continue
            for i in range(args.tasks):
                celery_tasks.noop.delay(i)
            before = runs_done(log)
            concurrency = args.concurrency if pool == "threads" else args.prefork
            out[f"{label} drain {pool}"] = drain(
                log, before + args.sends * (pool == "threads") + args.tasks,
                [sys.executable, "-m", "celery", "-A", name, "worker", "--pool", pool,
                 "-c", str(concurrency), "--without-gossip", "--without-mingle",
                 "--without-heartbeat", "-l", "WARNING", "-Q", f"c{n}"], work, env, args.cap)
        celery_tasks.app.close()
    return out


def one_round(args: argparse.Namespace, n: int) -> dict[str, float]:
    """Every phase once, starting at a different one each round (drift spreads evenly)."""
    work = tempfile.mkdtemp(prefix="doq-task-bench-")
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{work}"}
    phases: list[Any] = [
        lambda: doq_phase(args, n, "threads", work, env),
        lambda: doq_phase(args, n, "asyncio", work, env),
        lambda: celery_phase(args, n, "celery-doq", work, env)]
    if not args.no_rabbit:
        phases.append(lambda: celery_phase(args, n, "celery-rabbit", work, env))
    out: dict[str, float] = {}
    try:
        for k in range(len(phases)):
            out.update(phases[(n + k) % len(phases)]())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=5000, help="calls a worker drains")
    parser.add_argument("--sends", type=int, default=1000, help="calls one sender sends")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--prefork", type=int, default=4, help="Celery prefork processes")
    parser.add_argument("--prefork-doq", action="store_true", help="Celery prefork on DOQ too")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cap", type=float, default=300, help="seconds a drain may take")
    parser.add_argument("--no-rabbit", action="store_true", help="DOQ only")
    args = parser.parse_args()
    results: list[dict[str, float]] = []
    for n in range(args.rounds):
        got = one_round(args, n)
        print(json.dumps({"round": n, **{k: round(v, 1) for k, v in got.items()}}), flush=True)
        results.append(got)
    medians = {k: statistics.median(r[k] for r in results) for k in results[0]}
    print("\nmedians of", args.rounds, "rounds (tasks/s):")
    for key, value in medians.items():
        print(f"  {key:28s} {value:8.0f}")
    if "celery-rabbit drain threads" in medians:
        base_drain = medians["celery-rabbit drain threads"]
        base_send = medians["celery-rabbit send"]
        print("\nratios to Celery on RabbitMQ (same run):")
        for key, value in medians.items():
            base = base_send if key.endswith("send") else base_drain
            print(f"  {key:28s} {value / base:6.2f}x")


if __name__ == "__main__":
    main()
