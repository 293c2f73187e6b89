"""One OS thread that fsyncs the Raft journal for the event loop (L3).

gevent's thread pool hands every job through Python-level queues and conditions, a worker
greenlet per thread and an ``AsyncResult``; for a 0.1 ms fdatasync that machinery costs more
than the sync itself. This worker keeps one real thread asleep on an eventfd: the loop writes
the eventfd to hand it work, the thread runs the queued jobs and wakes the loop through one
libev async watcher, whose callback runs each job's ``done(ok)`` in the loop, in order.

Jobs are plain callables (``os.fdatasync`` on the journal's descriptor, the term/vote file's
write-and-rename); they must not touch gevent objects.
"""
from __future__ import annotations

import collections
import logging
import os
from typing import Any, Callable

import gevent
from gevent import monkey

log = logging.getLogger(__name__)

_start_thread = monkey.get_original("_thread", "start_new_thread")
Done = Callable[[bool], None]


class SyncThread:
    def __init__(self, name: str = "doq-fsync") -> None:
        self._loop = gevent.get_hub().loop
        self._jobs: collections.deque[tuple[Callable[..., Any], tuple[Any, ...], Done]] = \
            collections.deque()
        self._finished: collections.deque[tuple[Done, bool]] = collections.deque()
        self._wake_fd = os.eventfd(0, os.EFD_CLOEXEC)
        self._async = self._loop.async_()
        self._async.start(self._deliver)
        # Referenced: a greenlet waiting only for a sync must not see the loop as idle.
        self._stopping = False
        self.jobs_run = 0
        self._name = name
        _start_thread(self._work, ())

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], done: Done) -> None:
        """Run ``fn(*args)`` in the thread; ``done(ok)`` then runs in the event loop."""
        self._jobs.append((fn, args, done))
        os.eventfd_write(self._wake_fd, 1)

    def _work(self) -> None:                      # the OS thread
        while True:
            os.eventfd_read(self._wake_fd)       # blocks this thread only
            while self._jobs:
                fn, args, done = self._jobs.popleft()
                try:
                    fn(*args)
                    ok = True
                except Exception:  # noqa: BLE001 - reported to the loop as a failed sync
                    log.exception("%s: %s failed", self._name, getattr(fn, "__name__", fn))
                    ok = False
                self.jobs_run += 1
                self._finished.append((done, ok))
                self._async.send()
            if self._stopping:
                return

    def _deliver(self) -> None:                   # the event loop
        while self._finished:
            done, ok = self._finished.popleft()
            done(ok)

    def stop(self) -> None:
        """Let the thread finish what is queued and exit (the eventfd stays open: a late
        submit must not write to a reused descriptor)."""
        self._stopping = True
        os.eventfd_write(self._wake_fd, 1)
