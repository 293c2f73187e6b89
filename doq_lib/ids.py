"""Snowflake message ids (L0).

Layout (SPEC §5.7): ``(ms since 2010-11-04T01:42:54.657Z) << 22 | node << 12 | sequence``.

Two kinds of generators never collide:

* the replicated state machine assigns ids with node number 0 (:func:`next_fsm_id`), from the
  time carried in the command, so every replica computes the same id;
* :class:`Snowflake` (``POST /API/v1/ids``, ``GenerateIDs``) uses the answering node's number,
  which is always >= 1.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

EPOCH_MS = 1288834974657
NODE_BITS = 10
SEQ_BITS = 12
MAX_NODE = (1 << NODE_BITS) - 1
SEQ_MASK = (1 << SEQ_BITS) - 1
TIME_SHIFT = NODE_BITS + SEQ_BITS


def id_time_ms(message_id: int) -> int:
    """Unix milliseconds encoded in an id."""
    return (message_id >> TIME_SHIFT) + EPOCH_MS


def next_fsm_id(last_id: int, now_ms: int) -> int:
    """The next state-machine id after ``last_id`` at time ``now_ms`` (node bits stay 0).

    Strictly greater than ``last_id``; when the per-millisecond sequence overflows the id moves to
    the next millisecond instead of spilling into the node bits.
    """
    base = max(now_ms - EPOCH_MS, 0) << TIME_SHIFT
    candidate = max(last_id + 1, base)
    if (candidate >> SEQ_BITS) & MAX_NODE:
        candidate = ((candidate >> TIME_SHIFT) + 1) << TIME_SHIFT
    return candidate


class Snowflake:
    """Thread-safe per-node generator; ids are strictly increasing."""

    def __init__(self, node: int = 1, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._last_ms = 0
        self._seq = 0
        self.node = node

    @property
    def node(self) -> int:
        return self._node

    @node.setter
    def node(self, value: int) -> None:
        if not 1 <= value <= MAX_NODE:
            raise ValueError(f"node number must be in 1..{MAX_NODE}, got {value}")
        self._node = value

    def next_id(self) -> int:
        with self._lock:
            ms = max(int(self._clock() * 1000), self._last_ms)
            if ms == self._last_ms:
                self._seq = (self._seq + 1) & SEQ_MASK
                if self._seq == 0:
                    ms = self._last_ms + 1   # sequence exhausted: borrow the next millisecond
            else:
                self._seq = 0
            self._last_ms = ms
            return ((ms - EPOCH_MS) << TIME_SHIFT) | (self._node << SEQ_BITS) | self._seq

    def generate(self, count: int) -> list[int]:
        return [self.next_id() for _ in range(count)]
