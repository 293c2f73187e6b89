"""Free space on a node's disk (layer 1): below a reserve, the node refuses the writes that
grow its data (creating queues, enqueues, restores) and keeps serving the ones that shrink it
(dequeue, ack, nack, delete), as a disk alarm does. The reserve is what the journal and the
store still have for those, so a full disk never reaches a write the node already promised.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable


class DiskSpace:
    """``free()`` bytes at ``path`` (``statvfs``, at most every ``every`` seconds) and
    ``problem()``: why writes that grow the data are refused now (None: they are not)."""

    def __init__(self, path: str, reserve: int, every: float = 0.5,
                 statvfs: Callable[[str], Any] = os.statvfs,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path, self.reserve, self.every = path, reserve, every
        self._statvfs, self._monotonic = statvfs, monotonic
        self._free, self._read_at = -1, float("-inf")

    def free(self) -> int:
        now = self._monotonic()
        if now - self._read_at >= self.every:
            self._read_at = now
            try:
                st = self._statvfs(self.path)
                self._free = st.f_bavail * st.f_frsize
            except OSError:
                self._free = -1                  # unknown: do not refuse on a failed check
        return self._free

    def problem(self) -> str | None:
        free = self.free()
        if 0 <= free < self.reserve:
            return (f"insufficient storage: {free} bytes free on this node's disk, below "
                    f"storage.min_free_bytes ({self.reserve}); new messages are refused "
                    "until space is freed (consuming and acknowledging still work)")
        return None
