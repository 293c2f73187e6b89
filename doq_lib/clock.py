"""Time sources (L0). Only the proposer reads the wall clock; the state machine never does.

A node's time is :class:`SteadyClock`: unix time that advances with the monotonic clock, so
a jump of the wall clock (a mistaken ``date -s``, a VM resumed, a large NTP step) does not
jump the time the leader puts in its entries. Deadlines of unacked messages, delayed
messages and the time in new ids would all jump with it: an hour forward would redeliver
every message in flight at once and deliver delayed ones an hour early; backward, the state
machine would hold its time still (it never goes back) for an hour. The steady clock instead
follows the wall clock by slewing, at most :data:`SLEW_RATE` seconds per second, so small
corrections are absorbed in seconds and a jump of an hour fades in over 100 hours; the
difference is exported as ``doq_clock_offset_seconds`` for alerting.
"""
from __future__ import annotations

import time
from typing import Callable, Protocol

SLEW_RATE = 0.01                  # seconds of catching up per second (1 %)


class Clock(Protocol):
    def now(self) -> float: ...


class WallClock:
    """Unix time in seconds (float)."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


class SteadyClock:
    """Unix time moving with ``monotonic``, slewed toward ``source`` at ``rate`` (see the
    module notes); it never goes back, even when ``source`` does."""

    def __init__(self, source: Clock | None = None, rate: float = SLEW_RATE,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.source = source or WallClock()
        self.rate = rate
        self._monotonic = monotonic
        self._base = self.source.now()            # unix time at monotonic ``_start``
        self._start = self._last = monotonic()
        self.offset = 0.0                        # source minus steady, at the last reading

    def now(self) -> float:
        mono = self._monotonic()
        elapsed = mono - self._last
        self._last = mono
        steady = self._base + (mono - self._start)
        offset = self.source.now() - steady
        if offset:
            allowed = self.rate * max(elapsed, 0.0)
            step = max(-allowed, min(allowed, offset))
            self._base += step
            steady += step
            offset -= step
        self.offset = offset
        return steady


class OffsetClock:
    """Fault injection (``faults.clock_offset_file``): the wall clock plus the number of seconds
    written in ``path`` (re-read at most every ``every`` seconds; missing file: 0). The chaos
    harness and the tests move a node's wall clock with it."""

    def __init__(self, path: str, every: float = 0.1) -> None:
        self.path, self.every = path, every
        self._offset, self._read_at = 0.0, -1.0

    def now(self) -> float:
        mono = time.monotonic()
        if mono - self._read_at >= self.every:
            self._read_at = mono
            try:
                with open(self.path, encoding="ascii") as f:
                    self._offset = float(f.read().strip() or 0)
            except (OSError, ValueError):
                self._offset = 0.0
        return time.time() + self._offset


def node_clock(offset_file: str = "", injecting: bool = False) -> SteadyClock:
    """The clock of a node: steady over the wall clock, or over an :class:`OffsetClock` of
    ``offset_file`` when faults are injected (``faults.clock_offset_file``,
    ``faults.enabled``)."""
    return SteadyClock(OffsetClock(offset_file)) if injecting and offset_file \
        else SteadyClock()


def now_ms(clock: Clock) -> int:
    return int(clock.now() * 1000)
