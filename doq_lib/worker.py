"""``doq worker``: runs an :class:`~doq_lib.tasks.App`'s tasks from its queues.

    doq worker myapp.tasks:app --queues emails,images --concurrency 8 --grace 30

Each queue has a consumer of its own (its own client and thread) that keeps ``prefetch``
messages taken (default 4 per slot, as Celery's default) and hands them to the pool as its
slots free up; a message that waits has its lease kept (touched) like a running one. The pool
is ``threads`` (a thread per run; an ``async def`` task runs to its end in its thread),
``asyncio`` (runs are awaited on one event loop: ``async def`` tasks share it, and one past
its ``timeout`` is cancelled, i.e. interrupted; a plain function runs on the loop's
executor threads; settles, which block, run on a few threads of their own) or
``processes`` (each run in one of ``concurrency`` child processes, which a run past its
``timeout`` is ended to interrupt it: :mod:`doq_lib.worker_processes`).

For each message the worker reads the envelope and runs the task:

- it returns: the message is acked, with the follow-ups the task added
  (``current().then``), in one operation;
- it raises (any BaseException): the message is given back (nacked) with the error and the
  task's back-off, until it has failed ``retries + 1`` times; then (reason retries_spent),
  or at once for :class:`Reject` and ``dont_retry`` (rejected), it is dead-lettered;
- a message it cannot read, for any reason, is dead-lettered at once (unreadable).

While a task runs past half its queue's ack timeout, the worker extends the lease (touch),
so a long task keeps its message. A task that outlives its ``timeout`` is interrupted
(``asyncio`` for ``async def`` tasks, ``processes``) or, on threads, reported and
abandoned: its message is given back (or dead-lettered) as if it had raised, and what the
thread does later is ignored (its late ack would be stale and is refused). Python cannot
stop a thread: the thread keeps its slot until the function returns.

SIGTERM or SIGINT: the worker stops taking, gives back what it took and did not start,
lets the running tasks finish within ``grace`` seconds, then gives back the rest.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from doq_lib import tracing
from doq_lib.client import Delivered, GrpcClient
from doq_lib.errors import DoqError, InvalidArgument, QueueNotFound, StaleDelivery
from doq_lib.tasks import (
    App,
    Call,
    Running,
    Task,
    backoff_delay,
    describe,
    error_text,
    load_app,
    read_envelope,
    set_current,
)
from doq_lib.worker_acks import AckBatcher, settle_once
from doq_lib.worker_metrics import WorkerMetrics
from doq_lib.worker_processes import ChildFailure, ChildRejected, Children

log = logging.getLogger("doq.worker")

WATCH_EVERY = 0.5          # seconds between two looks at the running tasks
POOLS = ("threads", "asyncio", "processes")
RECEIVE_WAIT = 0.5         # seconds a consumer waits for a message before it looks up
PREFETCH_PER_SLOT = 4      # messages a queue's consumer keeps taken per slot, by default
ACKS_PENDING = 8           # acks per slot that may wait to be sent before runs wait


async def _awaited(result: Any) -> Any:
    return await result




@dataclass
class Run:
    """A message being worked on."""

    message: Delivered
    task: Task[Any, Any] | None
    started: float
    touched: float
    lease: float                          # the queue's ack timeout, seconds
    abandoned: bool = False
    running: Running | None = field(default=None, repr=False)
    client: Any = field(default=None, repr=False)     # the consumer's, that settles it


class Worker:
    """Runs ``app``'s tasks from ``queues`` on ``concurrency`` threads (see the module
    notes). :meth:`run` blocks until :meth:`stop` (or a signal, from the main thread)."""

    def __init__(self, app: App, queues: Sequence[str], concurrency: int = 8,
                 grace: float = 30.0, metrics: WorkerMetrics | None = None,
                 pool: str = "threads", spec: str = "", prefetch: int | None = None) -> None:
        """``spec``: the app's ``module:attribute``, which child processes import (needed
        by the ``processes`` pool); ``prefetch``: messages each queue's consumer keeps taken
        (default 4 per slot, at most 1000)."""
        if not queues:
            raise InvalidArgument("give at least one queue")
        if pool not in POOLS:
            raise InvalidArgument(f"--pool: expected one of {', '.join(POOLS)}")
        if pool == "processes" and not spec:
            raise InvalidArgument("the processes pool needs the app's module:attribute")
        self.pool, self.spec = pool, spec
        if not 1 <= concurrency <= 1024:
            raise InvalidArgument("concurrency must be from 1 to 1024")
        if prefetch is not None and not 1 <= prefetch <= 1000:
            raise InvalidArgument("prefetch must be from 1 to 1000")
        self.prefetch = prefetch or min(1000, PREFETCH_PER_SLOT * concurrency)
        self._held: dict[tuple[str, int, str], float] = {}   # taken, not handed out: touched
        self._consumers: dict[str, Any] = {}
        self.app, self.queues = app, list(dict.fromkeys(queues))
        self.concurrency, self.grace = concurrency, grace
        self._slots = threading.BoundedSemaphore(concurrency)
        self._stopping = threading.Event()
        self._runs: dict[int, Run] = {}
        # the clients of consumers that ended, closed once no run settles through them
        self._retired: list[Any] = []
        self._stop_reason = ""
        self._batchers: dict[str, AckBatcher] = {}
        self._lock = threading.Lock()
        self.counts = {"started": 0, "succeeded": 0, "failed": 0, "retried": 0,
                       "dead_lettered": 0, "abandoned": 0}
        self.metrics = metrics
        if metrics is not None:
            metrics.in_flight.set_function(lambda: len(self._running()))

    def _count(self, outcome: str, task: str) -> None:
        with self._lock:
            self.counts[outcome] += 1
        if self.metrics is not None:
            self.metrics.counters[outcome].labels(task).inc()

    # -- running ---------------------------------------------------------------------------
    def run(self, install_signals: bool = True) -> None:
        """Work until stopped; then give back what is left (see the module notes)."""
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda number, _: self.stop(signal.Signals(number).name))
        for queue in self.queues:
            self.app.ensure_queue(queue)
            self._batchers[queue] = AckBatcher(self.app.connect(), queue,
                                               self._acked, ACKS_PENDING * self.concurrency)
        children: Children | None = None
        if self.pool == "threads":
            pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="doq-task")

            def submit(run: Run) -> None:
                pool.submit(self._work, run)
        elif self.pool == "processes":      # a thread per run waits for its child
            children = Children(self.spec, self.concurrency)
            pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="doq-child")

            def submit(run: Run) -> None:
                assert children is not None
                pool.submit(self._work, run, children)
        else:                               # one event loop; settles on a few threads
            pool = ThreadPoolExecutor(min(self.concurrency, 16), thread_name_prefix="doq-settle")
            loop = asyncio.new_event_loop()
            looping = threading.Thread(target=loop.run_forever, daemon=True, name="doq-loop")
            looping.start()
        takers: list[Any] = []
        if self.pool == "asyncio":          # the consumers run on the loop too
            takers = [asyncio.run_coroutine_threadsafe(self._take_async(queue, pool), loop)
                      for queue in self.queues]
        else:
            takers = [threading.Thread(target=self._take, args=(queue, submit), daemon=True,
                                       name=f"doq-take-{queue}") for queue in self.queues]
            for taker in takers:
                taker.start()
        log.info("worker: %d %s on %s", self.concurrency, {
            "threads": "threads", "processes": "processes",
            "asyncio": "tasks on an event loop"}[self.pool], ", ".join(self.queues))
        while not self._stopping.wait(WATCH_EVERY):
            self._watch()
        log.info("worker: %s: stopping; %d running, %d taken and not started, waiting up "
                 "to %g s for the running ones", self._stop_reason or "stop asked",
                 len(self._running()), len(self._live()) - len(self._running()), self.grace)
        for taker in takers:
            if isinstance(taker, threading.Thread):
                taker.join(timeout=30)
            else:
                try:
                    taker.result(timeout=30)
                except Exception as exc:  # noqa: BLE001 - reported; the stop goes on
                    log.warning("a consumer ended with %r", exc)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and self._live():
            time.sleep(0.05)
            self._watch()
        for run in self._live():
            self._give_back(run, "the worker stopped before it finished")
        for batcher in self._batchers.values():
            batcher.close()
            batcher.client.close()
        with self._lock:
            clients, self._retired = self._retired, []
        for client in clients:
            client.close()
        pool.shutdown(wait=False, cancel_futures=True)
        if children is not None:
            children.close()
        if self.pool == "asyncio":
            loop.call_soon_threadsafe(loop.stop)
        log.info("worker stopped: %s", self.counts)

    def stop(self, reason: str = "") -> None:
        """Stop taking; :meth:`run` returns after the running tasks (within the grace).
        ``reason``: what asked (a signal's name), for the log."""
        self._stop_reason = self._stop_reason or reason
        self._stopping.set()

    def unfinished(self) -> int:
        """Runs whose task still runs on a thread after :meth:`run` returned: abandoned
        (past their timeout, or the grace), their messages given back."""
        with self._lock:
            return len(self._runs)

    def _live(self) -> list[Run]:
        """Runs going on and messages taken that wait for a slot."""
        with self._lock:
            return [r for r in self._runs.values() if not r.abandoned]

    def _running(self) -> list[Run]:
        """Runs that have started (their task read)."""
        return [r for r in self._live() if r.task is not None]

    def _take(self, queue: str, submit: Callable[[Run], None]) -> None:
        """One queue's consumer: takes a message whenever a thread is free; a consumer
        that ends (its node went away) is opened again."""
        while not self._stopping.is_set():
            try:
                self._consume(queue, submit)
            except QueueNotFound:
                log.error("queue %s does not exist", queue)
            except (StopIteration, DoqError, OSError) as exc:
                log.warning("queue %s: the consumer ended (%s); taking again", queue, exc)
            self._stopping.wait(1.0)

    def _consume(self, queue: str, submit: Callable[[Run], None]) -> None:
        client = self.app.connect()
        try:
            lease = float(client.queue(queue).settings.ack_timeout)
            consumer: Any = client.consume(queue, prefetch=self.prefetch) \
                if isinstance(client, GrpcClient) else \
                client.consume(queue, prefetch=self.prefetch, wait=RECEIVE_WAIT)
            with consumer:
                with self._lock:
                    self._consumers[queue] = (consumer, lease)
                while not self._stopping.is_set():
                    # A message first, then a slot: a taker that waited for a slot while
                    # long-polling an idle queue would starve the others (one slot, two
                    # queues). A taken message waits here for a slot with its lease kept.
                    message = consumer.receive(timeout=RECEIVE_WAIT)
                    if message is None:
                        continue
                    now = time.monotonic()
                    run = Run(message, None, now, now, lease, client=client)
                    with self._lock:
                        self._runs[message.id] = run
                    while not self._slots.acquire(timeout=RECEIVE_WAIT):
                        if self._stopping.is_set():
                            with self._lock:
                                self._runs.pop(message.id, None)
                            self._give_back(run, "the worker stopped before it started")
                            return
                    run.started = time.monotonic()
                    submit(run)
        finally:
            # closed once the messages it took have settled through it (_watch), or when
            # the worker ends
            with self._lock:
                self._retired.append(client)
                self._consumers.pop(queue, None)

    async def _take_async(self, queue: str, settlers: ThreadPoolExecutor) -> None:
        """:meth:`_take` for the asyncio pool: the consumer is the asyncio client's, on the
        loop, and hands runs to it without a thread in between."""
        slots = asyncio.Semaphore(self.concurrency)
        while not self._stopping.is_set():
            try:
                await self._consume_async(queue, settlers, slots)
            except QueueNotFound:
                log.error("queue %s does not exist", queue)
            except (StopAsyncIteration, DoqError, OSError) as exc:
                log.warning("queue %s: the consumer ended (%s); taking again", queue, exc)
            await asyncio.sleep(1.0)

    async def _consume_async(self, queue: str, settlers: ThreadPoolExecutor,
                             slots: asyncio.Semaphore) -> None:
        client = await self.app.connect_async()
        settler = self._batchers[queue].client     # the runs' settles run on threads
        try:
            lease = float((await client.queue(queue)).settings.ack_timeout)
            from doq_lib.client.aio import AsyncHttpClient
            consumer: Any = client.consume(queue, prefetch=self.prefetch, wait=RECEIVE_WAIT) \
                if isinstance(client, AsyncHttpClient) else \
                client.consume(queue, prefetch=self.prefetch)
            async with consumer:
                with self._lock:
                    self._consumers[queue] = (consumer, lease)
                while not self._stopping.is_set():
                    taken = await consumer.receive(timeout=RECEIVE_WAIT)
                    if taken is None:
                        continue
                    now = time.monotonic()
                    run = Run(Delivered.of(taken, queue, settler), None, now, now, lease)
                    with self._lock:
                        self._runs[taken.id] = run
                    while True:
                        try:
                            if slots.locked():
                                await asyncio.wait_for(slots.acquire(), RECEIVE_WAIT)
                            else:
                                await slots.acquire()            # free: at once
                            break
                        except asyncio.TimeoutError:
                            if self._stopping.is_set():
                                with self._lock:
                                    self._runs.pop(taken.id, None)
                                await asyncio.get_running_loop().run_in_executor(
                                    settlers, self._give_back, run,
                                    "the worker stopped before it started")
                                return
                    run.started = time.monotonic()
                    asyncio.ensure_future(self._work_async(run, settlers, slots))
        finally:
            with self._lock:
                self._consumers.pop(queue, None)
            await client.close()

    # -- one message -----------------------------------------------------------------------
    def _begin(self, run: Run) -> Call | None:
        """Read ``run``'s call; None (its message dead-lettered) when it names no task."""
        call = self._read(run)
        if isinstance(call, str):
            self._unreadable(run, call)
            return None
        return call

    def _read(self, run: Run) -> Call | str:
        """``run``'s call, its task found and the run started; or why it cannot run (no
        I/O either way)."""
        try:
            call = read_envelope(run.message.content)
            task = self.app.tasks.get(call.task)
            if task is None:
                raise InvalidArgument(f"unknown task {call.task!r:.200}")
        except InvalidArgument as exc:
            return str(exc)
        except Exception as exc:             # noqa: BLE001 - whatever fails to read it: never again
            return f"the message could not be read: {describe(exc)}"
        run.task = task
        run.running = Running(run.message, task)
        self._count("started", task.name)
        return call

    def _unreadable(self, run: Run, why: str) -> None:
        message = run.message
        why = error_text(why)
        self._settle(run, lambda: message.reject(error=why, reason="unreadable"),
                     "dead_lettered")
        log.error("message %s of %s: %s: dead-lettered", message.id, message.queue, why)

    def _finish(self, run: Run, exc: BaseException | None) -> None:
        """Settle ``run`` by its outcome: ack (with its follow-ups), or a failure."""
        assert run.task is not None and run.running is not None
        if self.metrics is not None:
            self.metrics.duration.labels(run.task.name).observe(time.monotonic() - run.started)
        if exc is not None:
            self._failed(run, exc)
            return
        if not run.abandoned:
            self._batchers[run.message.queue].ack(run.message, run.running.follow_ups,
                                                  run.task.name)

    def _acked(self, task: str, applied: bool) -> None:
        """An ack the batcher sent is durable (applied), or was refused or lost."""
        if applied:
            self._count("succeeded", task)

    def _end(self, run: Run, slots: asyncio.Semaphore | None = None) -> None:
        with self._lock:
            self._runs.pop(run.message.id, None)
        (slots or self._slots).release()

    def _work(self, run: Run, children: Children | None = None) -> None:
        """One message on a pool thread (with ``children``: run in a child process)."""
        try:
            call = self._begin(run)
            if call is None:
                return
            assert run.task is not None and run.running is not None
            set_current(run.running)
            failure: BaseException | None = None
            try:
                with self._span(run):
                    if children is not None:
                        run.running.follow_ups.extend(children.run(run.task, call,
                                                                   run.message))
                    else:
                        result = run.task.fn(*call.args, **call.kwargs)
                        if inspect.isawaitable(result):   # an async task on the thread pool
                            asyncio.run(_awaited(result))
            except BaseException as exc:           # noqa: BLE001 - any failure is the task's
                # SystemExit, KeyboardInterrupt, GeneratorExit included: on a pool thread
                # only the task can have raised them, and a message must never stay unsettled
                failure = exc
            finally:
                set_current(None)
            self._finish(run, failure)
        finally:
            self._end(run)

    async def _work_async(self, run: Run, settlers: ThreadPoolExecutor,
                          slots: asyncio.Semaphore) -> None:
        """One message on the event loop (``--pool asyncio``): an async task is awaited
        (and cancelled at its timeout), a plain one runs on the loop's default threads;
        settles, which block, run on ``settlers``."""
        loop = asyncio.get_running_loop()
        try:
            call = self._read(run)
            if isinstance(call, str):
                await loop.run_in_executor(settlers, self._unreadable, run, call)
                return
            task = run.task
            assert task is not None
            set_current(run.running)
            failure: BaseException | None = None
            try:
                with self._span(run):
                    if inspect.iscoroutinefunction(task.fn):
                        await asyncio.wait_for(task.fn(*call.args, **call.kwargs), task.timeout)
                    else:
                        context = contextvars.copy_context()
                        await loop.run_in_executor(None, functools.partial(
                            context.run, task.fn, *call.args, **call.kwargs))
            except asyncio.TimeoutError:
                failure = TimeoutError(f"timed out after {task.timeout:g} s (interrupted)")
            except BaseException as exc:           # noqa: BLE001 - any failure is the task's
                failure = exc                      # (SystemExit, CancelledError, ... too)
            finally:
                set_current(None)
            if failure is None and self._batchers[run.message.queue].has_room():
                self._finish(run, None)            # an ack handed over: it does not block
            else:
                await loop.run_in_executor(settlers, self._finish, run, failure)
        finally:
            self._end(run, slots)

    @staticmethod
    def _span(run: Run) -> Any:
        """The run's OpenTelemetry span (when the extra is installed; see doq_lib.tracing)."""
        assert run.task is not None
        message = run.message
        return tracing.processing(message.queue, run.task.name, message.id, message.deliveries,
                                  message.metadata)

    def _failed(self, run: Run, exc: BaseException) -> None:
        message, task = run.message, run.task
        assert task is not None
        error = error_text(exc.text if isinstance(exc, (ChildFailure, ChildRejected)) else
                           describe(exc))
        attempt = message.deliveries
        if isinstance(exc, task.dont_retry) or attempt > task.retries:
            rejected = isinstance(exc, task.dont_retry)
            why = "not retried" if rejected else f"{attempt} runs, retries spent"
            reason = "rejected" if rejected else "retries_spent"
            log.error("task %s message %s failed (%s): %s: dead-lettered", task.name,
                      message.id, why, error)
            self._settle(run, lambda: message.reject(error=error, reason=reason),
                         "dead_lettered")
            return
        delay = backoff_delay(attempt, task.backoff)
        log.warning("task %s message %s failed (run %d of %d): %s: again in %d s", task.name,
                    message.id, attempt, task.retries + 1, error, delay)
        self._settle(run, lambda: message.nack(error=error, delay=delay), "retried")

    def _settle(self, run: Run, settle: Any, outcome: str) -> None:
        """Settle ``run``'s message unless it was abandoned meanwhile (as
        :func:`~doq_lib.worker_acks.settle_once` does); count ``outcome``."""
        if run.abandoned or not settle_once(settle, run.message):
            return
        name = run.task.name if run.task is not None else ""
        self._count(outcome, name)
        if outcome in ("retried", "dead_lettered"):
            self._count("failed", name)

    def _give_back(self, run: Run, why: str) -> None:
        run.abandoned = True
        try:
            run.message.nack(error=why)
        except DoqError:
            pass                           # its lease runs out: delivered again anyway

    # -- leases and timeouts ---------------------------------------------------------------
    def _keep_held(self, now: float) -> None:
        """Touch the leases of messages taken and not yet handed out (prefetched) once half
        their lease has passed since they were taken or last touched."""
        with self._lock:
            consumers = list(self._consumers.items())
        seen = set()
        for queue, (consumer, lease) in consumers:
            for message in consumer.waiting():
                key = (queue, message.id, message.delivery)
                seen.add(key)
                since = self._held.setdefault(key, now)
                if now - since < lease / 2:
                    continue
                try:
                    self._batchers[queue].client.touch(queue, message.id,
                                                       delivery=message.delivery)
                    self._held[key] = now
                except DoqError as exc:
                    log.warning("message %s of %s: touch failed: %s", message.id, queue, exc)
                    self._held[key] = float("inf") if isinstance(exc, StaleDelivery) else now
        for key in [k for k in self._held if k not in seen]:
            del self._held[key]

    def _close_retired(self) -> None:
        """Close the clients of ended consumers that no run settles through any more."""
        with self._lock:
            if not self._retired:
                return
            used = {id(run.client) for run in self._runs.values()}
            idle = [c for c in self._retired if id(c) not in used]
            self._retired = [c for c in self._retired if id(c) in used]
        for client in idle:
            client.close()

    def _watch(self) -> None:
        """Touch the leases of long runs and of prefetched messages; abandon runs past their
        task's timeout."""
        now = time.monotonic()
        self._keep_held(now)
        self._close_retired()
        for run in self._live():
            task = run.task
            if task is not None and task.timeout is not None and \
                    now - run.started > task.timeout and self.pool != "processes" and not (
                        self.pool == "asyncio" and inspect.iscoroutinefunction(task.fn)):
                run.abandoned = True
                log.error("task %s message %s timed out after %.0f s: abandoned",
                          task.name, run.message.id, now - run.started)
                self._count("abandoned", task.name)
                run.abandoned = False          # settle it once, as a failure
                self._failed(run, TimeoutError(f"timed out after {task.timeout:g} s"))
                run.abandoned = True
                continue
            if now - run.touched > run.lease / 2:
                try:
                    run.message.touch()
                    run.touched = now
                except StaleDelivery:
                    run.abandoned = True
                    log.warning("message %s of %s: lease lost while running",
                                run.message.id, run.message.queue)
                except DoqError as exc:
                    log.warning("message %s: touch failed: %s", run.message.id, exc)


def main(spec: str, queues: Sequence[str], concurrency: int, grace: float,
         metrics: str = "", pool: str = "threads", prefetch: int | None = None) -> int:
    """``doq worker``: exit code 0 after a clean stop, 2 for a bad app or options.
    ``metrics``: host:port to serve Prometheus metrics on ("": none)."""
    try:
        app = load_app(spec)
        worker = Worker(app, queues, concurrency, grace, WorkerMetrics() if metrics else None,
                        pool, spec, prefetch)
        if metrics and worker.metrics is not None:
            worker.metrics.serve(metrics)
    except (InvalidArgument, ValueError, OSError) as exc:
        print(f"doq worker: {getattr(exc, 'message', exc)}")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        worker.run()
    except DoqError as exc:                 # e.g. no node reachable, or the key may not
        print(f"doq worker: {exc.message}")
        return 1
    stray = worker.unfinished()
    if stray:
        # Python would wait for these at exit; their runs were given back: end without them
        log.warning("worker: %d abandoned task(s) still running on threads: exiting "
                    "without them", stray)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
