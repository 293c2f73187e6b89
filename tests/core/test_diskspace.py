"""doq_lib/diskspace.py: free space read at most twice a second, and why writes that grow the
data are refused below the reserve. The disk itself: tests/cluster/test_disk_full.py."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from doq_lib import commands as C
from doq_lib.diskspace import DiskSpace


class Disk:
    def __init__(self, free: int) -> None:
        self.free, self.reads, self.now = free, 0, 0.0

    def statvfs(self, path: str) -> Any:
        self.reads += 1
        if self.free < 0:
            raise OSError("gone")
        return SimpleNamespace(f_bavail=self.free // 4096, f_frsize=4096)


def test_below_the_reserve_growing_writes_are_refused_and_it_says_why() -> None:
    disk = Disk(10 << 20)
    space = DiskSpace("/data", 8 << 20, 0.5, disk.statvfs, lambda: disk.now)
    assert space.problem() is None and space.free() == 10 << 20
    disk.free = 1 << 20
    assert space.problem() is None                      # read again only after 0.5 s
    disk.now = 0.6
    problem = space.problem()
    assert problem is not None and "1048576 bytes free" in problem
    assert "storage.min_free_bytes (8388608)" in problem
    assert disk.reads == 2


def test_an_unreadable_disk_is_not_a_reason_to_refuse() -> None:
    disk = Disk(-1)
    assert DiskSpace("/data", 8 << 20, 0.5, disk.statvfs).problem() is None


def test_the_operations_that_grow_the_data() -> None:
    assert {C.NAMES[code] for code in C.GROWS} == {
        "create_queue", "enqueue", "enqueue_batch", "enqueue_seq", "restore_begin",
        "restore_put", "schedule_put", "schedule_fire"}    # (a fire stores messages)
