"""Time sources (L0). Only the proposer reads the wall clock; the state machine never does."""
from __future__ import annotations

import time
from typing import Protocol


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


def now_ms(clock: Clock) -> int:
    return int(clock.now() * 1000)
