"""Per-queue operation counters and sliding-window rates (SPEC §5.11).

Counting happens where commands are applied, bucketed by the command's time; rates are read
against the reader's clock. Counts of the current, unfinished second are not visible yet.
These numbers are node-local statistics, not replicated state.
"""
from __future__ import annotations

import collections

KINDS = ("enqueue", "dequeue", "ack", "nack")


class RateWindow:
    __slots__ = ("window", "_buckets", "total")

    def __init__(self, window: int) -> None:
        self.window = window
        self._buckets: collections.deque[list[int]] = collections.deque()  # [second, count]
        self.total = 0

    def add(self, now_s: int, count: int = 1) -> None:
        self.total += count
        buckets = self._buckets
        if buckets and buckets[-1][0] >= now_s:
            buckets[-1][1] += count          # same second (or a clock that stepped back)
        else:
            buckets.append([now_s, count])
        while buckets and buckets[0][0] < now_s - self.window - 1:
            buckets.popleft()

    def rate(self, now_s: int) -> float:
        low = now_s - self.window
        counted = sum(c for s, c in self._buckets if low <= s < now_s)
        return counted / self.window


class QueueStats:
    def __init__(self, window: int) -> None:
        self.windows = {kind: RateWindow(window) for kind in KINDS}
        self.redelivered = 0          # messages whose ack timeout ran out (back to ready)
        self.dead_lettered: dict[str, int] = {}     # reason -> messages dead-lettered
        # reason -> dead letters the dead-letter queue refused (full, overflow reject): the
        # message stayed where it was
        self.dead_letter_refused: dict[str, int] = {}
        self.rejected_full = 0        # enqueues refused: the queue held max_messages
        self.deduplicated = 0         # enqueues answered as duplicates (nothing stored)
        self.purged = 0               # messages dropped by purges
        self.rate_limited = 0         # times a group ran out of its delivery rate

    def count(self, kind: str, now_s: int, n: int = 1) -> None:
        self.windows[kind].add(now_s, n)

    def rates(self, now_s: int) -> dict[str, float]:
        return {kind: w.rate(now_s) for kind, w in self.windows.items()}

    def totals(self) -> dict[str, int]:
        return {kind: w.total for kind, w in self.windows.items()}
