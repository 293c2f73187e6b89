"""The apply pipeline: committed entries reach the state machine in one OS thread (L3).

PySyncObj applies committed entries inside its tick. Running the state machine there would stall
the tick (and every request) for each LMDB commit and its fsync. Instead the replicated method
only queues the entry here and returns an :class:`EntryResult`; one writer thread drains the
queue in log order, applying everything that accumulated in a single LMDB transaction, and the
results are handed back to the event loop. Clients are answered from those results.
"""
from __future__ import annotations

import collections
import logging
import os
from typing import Any, Callable, NoReturn

import gevent.event
import gevent.threadpool

from doq_lib.errors import ResultCode
from doq_lib.fsm import Entry, Result, StateMachine
from doq_lib.log import apply_quietly

log = logging.getLogger(__name__)
Results = list[Result] | None


class EntryResult:
    """The outcome of one Raft entry, available once the writer thread has applied it.

    A merged entry holds several proposers' batches: ``groups`` lists each batch's id and
    where its results start, and :meth:`part` gives one batch its own results."""

    __slots__ = ("results", "done", "_callbacks", "groups")

    def __init__(self, groups: list[tuple[str, int, int]] | None = None) -> None:
        self.results: Results = None
        self.done = False
        self._callbacks: list[Callable[[Results], None]] = []
        self.groups = groups              # (batch id, first result, count) per batch

    def part(self, batch_id: str, results: Results) -> Results:
        """The results of batch ``batch_id`` among ``results`` (all of them if not merged)."""
        if self.groups is None or results is None:
            return results
        for bid, start, count in self.groups:
            if bid == batch_id:
                return results[start:start + count]
        return None

    def add_callback(self, callback: Callable[[Results], None]) -> None:
        if self.done:
            callback(self.results)
        else:
            self._callbacks.append(callback)

    def resolve(self, results: Results) -> None:
        self.results, self.done = results, True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(results)
            except Exception:  # noqa: BLE001 - one bad waiter must not starve the others
                log.exception("entry result callback failed")


class ApplyPipeline:
    def __init__(self, fsm: StateMachine, threaded: bool = True) -> None:
        self.fsm = fsm
        self.threaded = threaded
        self._pool = gevent.threadpool.ThreadPool(1)      # the one LMDB writer thread
        if threaded:       # reads that walk the indexes take turns with the writer
            fsm.serialize = lambda read: apply_quietly(self._pool, read)
        self._loop = gevent.get_hub().loop
        self._queue: collections.deque[tuple[Entry, EntryResult]] = collections.deque()
        self._running = False
        self._idle = gevent.event.Event()
        self._idle.set()
        self._idle_callbacks: list[Callable[[], None]] = []
        self.entries_applied = 0
        self.drains = 0
        # called with (batch id, results) for every applied entry that carries a batch id
        self.on_batch: Callable[[str, Results], None] | None = None
        # the state machine's clock as of the last entry whose results were handed out
        self.resolved_clock = fsm.last_now_ms
        self.resolved_index = 0            # the last entry whose results were handed out

    def submit(self, index: int, ops: list[Any], now_ms: int, expires_ms: int = 0,
               batch_id: str = "", rules: int = 1) -> EntryResult:
        result = EntryResult()
        self._queue.append(((index, ops, now_ms, expires_ms, batch_id, None, rules), result))
        self._idle.clear()
        self._kick()
        return result

    def submit_groups(self, index: int,
                      groups: list[tuple[list[Any], int, int, str, int]]) -> EntryResult:
        """A merged entry: several batches ``(ops, now_ms, expires_ms, batch id, rules)``
        applied as one state machine entry (one transaction, one index); each batch expires
        on its own, the entry's time is the latest of theirs and its rules the oldest (a
        cluster runs one version: they are the same)."""
        ops: list[Any] = []
        spans, layout = [], []
        for batch_ops, _, expires_ms, batch_id, _ in groups:
            spans.append((batch_id, len(ops), len(batch_ops)))
            layout.append((len(batch_ops), expires_ms))
            ops.extend(batch_ops)
        now_ms = max((g[1] for g in groups), default=0)
        rules = min((g[4] for g in groups), default=1)
        result = EntryResult(spans)
        self._queue.append(((index, ops, now_ms, 0, "", layout, rules), result))
        self._idle.clear()
        self._kick()
        return result

    def _kick(self) -> None:
        if self._running:
            return
        if not self._queue:
            self._idle.set()
            callbacks, self._idle_callbacks = self._idle_callbacks, []
            for callback in callbacks:
                callback()
            return
        batch = list(self._queue)
        self._queue.clear()
        self._running = True

        if not self.threaded:
            self._loop.run_callback(self._drain_here, batch)
            return

        def early(outcomes: list[Results]) -> None:      # writer thread, before the commit
            self._loop.run_callback_threadsafe(self._resolve, batch, outcomes)

        job = self._pool.spawn(self.fsm.apply_entries, [entry for entry, _ in batch], early)
        job.rawlink(lambda done: self._finish(batch, done))

    def _drain_here(self, batch: list[tuple[Entry, EntryResult]]) -> None:
        """Inline mode: apply in the event loop's thread (no thread hand-offs)."""
        try:
            outcomes = self.fsm.apply_entries([entry for entry, _ in batch],
                                              lambda done: self._resolve(batch, done))
        except Exception as exc:  # noqa: BLE001 - see _stop_node
            self._stop_node(exc)
        self._running = False
        self.drains += 1
        self.entries_applied += len(batch)
        self._resolve(batch, outcomes)
        self._kick()

    def _resolve(self, batch: list[tuple[Entry, EntryResult]], outcomes: list[Results]) -> None:
        for (entry, result), outcome in zip(batch, outcomes):
            if result.done:
                continue
            self.resolved_index = max(self.resolved_index, entry[0])
            if outcome and any(code != ResultCode.EXPIRED for code, _ in outcome):
                self.resolved_clock = max(self.resolved_clock, entry[2])
            result.resolve(outcome)
            if self.on_batch is None:
                continue
            if result.groups is not None:
                for bid, _, _ in result.groups:
                    if bid:
                        self.on_batch(bid, result.part(bid, outcome))
            elif entry[4]:
                self.on_batch(entry[4], outcome)

    def _finish(self, batch: list[tuple[Entry, EntryResult]], job: Any) -> None:
        self._running = False
        self.drains += 1
        self.entries_applied += len(batch)
        if not job.successful():
            self._stop_node(job.exception)
        self._resolve(batch, job.value)
        self._kick()

    @staticmethod
    def _stop_node(exc: BaseException | None) -> NoReturn:
        """apply_entries contains every failure of an operation (rolled back, answered
        INTERNAL); it raises only when that containment itself failed, and then the
        in-memory state no longer matches the store. Applying more entries on it, or
        answering /readyz with 200, would serve a state no other replica has: the node
        stops instead (as for a failed commit), and a restart rebuilds the state from the
        store and the journal."""
        log.critical("the state machine failed and could not recover (%r); the node stops "
                     "so that a restart rebuilds its state from the store and the journal",
                     exc, exc_info=exc)
        logging.shutdown()
        os._exit(70)

    def when_idle(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` (in the event loop) once everything queued so far is applied."""
        if self._idle.is_set():
            callback()
        else:
            self._idle_callbacks.append(callback)

    @property
    def idle(self) -> bool:
        """Nothing submitted is still waiting to be applied."""
        return bool(self._idle.is_set())

    def wait_idle(self, timeout: float | None = None) -> bool:
        return bool(self._idle.wait(timeout))

    def run_in_writer(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` in the writer thread after everything queued so far, and wait for it."""
        self.wait_idle()
        return self._pool.apply(fn, args)

    def close(self) -> None:
        self.wait_idle(10)
        self._pool.kill()
