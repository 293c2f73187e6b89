"""A PySyncObj poller built on persistent gevent watchers (L3).

PySyncObj's poll poller, under gevent, goes through ``gevent.select.poll``, which creates and
destroys a libev watcher for every descriptor on every ``poll()`` call (two epoll_ctl calls per
descriptor per tick). This poller keeps one watcher per subscription. A watcher that fires is
paused (libev watchers are level-triggered: left running, an unread socket would keep the loop
spinning while the tick greenlet is busy elsewhere) and resumed at the next ``poll()``; since
that happens before the loop polls again, libev usually sees no change and makes no syscall.
"""
from __future__ import annotations

from typing import Any, Callable

import gevent
import gevent.event
from gevent import monkey

from doq_lib.raft.engine import POLL_EVENT_TYPE, Poller, set_poller_factory

EV_READ, EV_WRITE = 1, 2
_thread_ident = monkey.get_original("_thread", "get_ident")   # the OS thread, not a greenlet
Callback = Callable[[Any, int], None]


def _events(mask: int) -> int:
    events = 0
    if mask & POLL_EVENT_TYPE.READ or mask & POLL_EVENT_TYPE.ERROR:
        events |= EV_READ                 # errors show up as readability
    if mask & POLL_EVENT_TYPE.WRITE:
        events |= EV_WRITE
    return events or EV_READ


class GeventPoller(Poller):  # type: ignore[misc]  # PySyncObj has no annotations
    def __init__(self) -> None:
        self._loop = gevent.get_hub().loop
        self._subs: dict[Any, list[Any]] = {}       # descr -> [watcher, callback, events]
        self._ready: dict[Any, int] = {}            # descr -> libev events seen
        self._paused: list[Any] = []
        self._wake = gevent.event.Event()

    def subscribe(self, descr: Any, callback: Callback, eventMask: int) -> None:
        events = _events(eventMask)
        sub = self._subs.get(descr)
        if sub is not None and sub[2] == events:
            sub[1] = callback
            return
        self.unsubscribe(descr)
        fd = descr if isinstance(descr, int) else descr.fileno()
        watcher = self._loop.io(fd, events)
        self._subs[descr] = [watcher, callback, events]
        watcher.start(self._fired, descr, pass_events=True)

    def unsubscribe(self, descr: Any) -> None:
        sub = self._subs.pop(descr, None)
        self._ready.pop(descr, None)
        if sub is not None:
            sub[0].stop()
            sub[0].close()

    def _fired(self, revents: int, descr: Any) -> None:
        sub = self._subs.get(descr)
        if sub is None:
            return
        sub[0].stop()
        self._paused.append(descr)
        self._ready[descr] = self._ready.get(descr, 0) | revents
        self._wake.set()

    def _resume(self) -> None:
        """Watch again every descriptor dispatched by the previous poll()."""
        paused, self._paused = self._paused, []
        for descr in paused:
            sub = self._subs.get(descr)
            if sub is not None:
                sub[0].start(self._fired, descr, pass_events=True)

    def wake(self) -> None:
        """End the current (or the next) poll() at once."""
        self._wake.set()

    def poll(self, timeout: float) -> None:
        if not self._ready:
            self._resume()
            self._wake.clear()
            self._wake.wait(timeout)
        ready, self._ready = self._ready, {}
        for descr, revents in ready.items():
            sub = self._subs.get(descr)
            if sub is None:
                continue
            mask = (POLL_EVENT_TYPE.READ if revents & EV_READ else 0) | \
                (POLL_EVENT_TYPE.WRITE if revents & EV_WRITE else 0)
            sub[1](descr, mask)


def install() -> None:
    """Make every SyncObj created from now on use :class:`GeventPoller` (idempotent)."""
    set_poller_factory(GeventPoller)


class LoopNotifier:
    """Stands in for PySyncObj's pipe notifier: wakes the tick's poll directly from the event
    loop's thread (no pipe write and read per proposal or sync), through the loop from any
    other thread. (PySyncObj makes its pipe only when it ticks itself, ``autoTick=True``.)"""

    def __init__(self, poller: GeventPoller) -> None:
        self._poller = poller
        self._thread = _thread_ident()
        self._loop = gevent.get_hub().loop

    def notify(self) -> None:
        if _thread_ident() == self._thread:
            self._poller.wake()
        else:
            self._loop.run_callback_threadsafe(self._poller.wake)
