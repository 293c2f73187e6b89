"""Makes PySyncObj acknowledge only what is on disk (DESIGN.md §2.1).

PySyncObj 0.3.17 never fsyncs: its journal is an mmap nobody flushes, a follower acknowledges
appended entries as soon as they are in memory, and the leader counts itself toward the majority
unconditionally. This module retrofits durability:

* :class:`DurableJournal` — an append-only journal file of CRC-protected records (a torn tail
  after a crash is detected and cut off) whose ``sync()`` fdatasyncs it and advances
  ``synced_index``; term and vote are stored with write + fsync + rename + directory fsync
  before PySyncObj sends any message that depends on them.
* :class:`DurableTransport` — holds back a follower's successful ``next_node_idx`` (its ack)
  until the journal is synced past the acknowledged index; held acks are released by
  :meth:`DurableTransport.release_acks`, after one sync that covers every entry appended since
  the last one (group sync).
* The leader syncs before each commit-index computation: :class:`doq_lib.raft.node.RaftNode`
  calls ``sync()`` at the start of every tick and from an on-tick callback before it polls.

Blocking syscalls go through ``run_blocking`` (a real OS thread under gevent) so the event loop
keeps serving requests while the disk works.
"""
from __future__ import annotations

import logging
import os
import pickle
import struct
import threading
import time
import zlib
from typing import Any, Callable

import pysyncobj.syncobj as _syncobj
from pysyncobj.journal import Journal
from pysyncobj.transport import TCPTransport

log = logging.getLogger(__name__)

MAGIC = b"DOQJRNL1"
_HEAD = struct.Struct("<IQQI")        # command length, index, term, crc32 of the rest
Runner = Callable[..., Any]


def run_inline(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: str, data: bytes) -> None:
    """Replace ``path`` atomically and durably (write, fsync, rename, fsync the directory)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


class SyncStats:
    """Counters a test or /metrics reads (thread-safe enough: updated by one greenlet)."""

    def __init__(self) -> None:
        self.syncs = 0
        self.sync_seconds = 0.0
        self.meta_syncs = 0
        self.acks_held = 0
        self.acks_sent = 0
        self.acks_unsynced = 0          # acks sent for an index above synced_index: must stay 0


class DurableJournal(Journal):
    def __init__(self, path: str, run_blocking: Runner = run_inline) -> None:
        self.path = path
        self._run = run_blocking
        self.stats = SyncStats()
        self._entries: list[tuple[bytes, int, int]] = []
        self._offsets: list[int] = []
        self.dirty = False
        self.synced_index = 0
        self._meta_path = path + ".meta"
        self._meta = self._read_meta()
        self._meta_dirty = False
        self._open()

    # -- file ------------------------------------------------------------------------------------
    def _open(self) -> None:
        new = not os.path.exists(self.path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        if new or os.fstat(self._fd).st_size < len(MAGIC):
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, MAGIC, 0)
            os.fsync(self._fd)
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        self._end = self._scan()
        self.synced_index = self._entries[-1][1] if self._entries else 0

    def _scan(self) -> int:
        """Load every valid record; cut the file at the first torn or corrupt one."""
        size = os.fstat(self._fd).st_size
        if os.pread(self._fd, len(MAGIC), 0) != MAGIC:
            raise ValueError(f"{self.path}: not a DOQ journal")
        data = os.pread(self._fd, size, 0)
        pos = len(MAGIC)
        while pos + _HEAD.size <= size:
            length, idx, term, crc = _HEAD.unpack_from(data, pos)
            end = pos + _HEAD.size + length
            body = data[pos + _HEAD.size:end]
            if end > size or zlib.crc32(body, zlib.crc32(data[pos:pos + 20])) != crc:
                break
            self._entries.append((body, idx, term))
            self._offsets.append(pos)
            pos = end
        if pos != size:
            log.warning("journal %s: dropping %d bytes of torn tail", self.path, size - pos)
            os.ftruncate(self._fd, pos)
            os.fsync(self._fd)
        return pos

    @staticmethod
    def _record(command: bytes, idx: int, term: int) -> bytes:
        head = struct.pack("<IQQ", len(command), idx, term)
        return head + struct.pack("<I", zlib.crc32(command, zlib.crc32(head))) + command

    # -- Journal interface -------------------------------------------------------------------------
    def add(self, command: bytes, idx: int, term: int) -> None:
        record = self._record(command, idx, term)
        os.pwrite(self._fd, record, self._end)
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._end += len(record)
        self.dirty = True

    def clear(self) -> None:
        self._truncate(0)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        self._truncate(entryFrom)

    def _truncate(self, position: int) -> None:
        if position >= len(self._entries):
            return
        self._end = self._offsets[position]
        del self._entries[position:]
        del self._offsets[position:]
        os.ftruncate(self._fd, self._end)
        last = self._entries[-1][1] if self._entries else 0
        self.synced_index = min(self.synced_index, last)
        self.dirty = True

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Log compaction: keep entries from ``entryTo`` on, rewritten into a fresh file.

        The directory is fsynced first: PySyncObj has just renamed the new snapshot into place
        and that rename must be durable before the entries it covers disappear.
        """
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        keep = self._entries[entryTo:]
        tmp = self.path + ".compact"
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            f.write(b"".join(self._record(*entry) for entry in keep))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        os.close(self._fd)
        self._entries, self._offsets, self.dirty = [], [], False
        self._open()

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        if self._fd >= 0:
            self.sync_now()
            self._store_meta_now()
            os.close(self._fd)
            self._fd = -1

    def flush(self) -> None:
        self.sync()

    # -- durability ---------------------------------------------------------------------------------
    def sync(self) -> None:
        """fdatasync everything appended so far (no-op when nothing is pending)."""
        if not self.dirty:
            return
        target = self._entries[-1][1] if self._entries else 0
        self.dirty = False
        start = time.perf_counter()
        self._run(os.fdatasync, self._fd)
        self.stats.syncs += 1
        self.stats.sync_seconds += time.perf_counter() - start
        self.synced_index = max(self.synced_index, target) if self._entries else 0

    def sync_now(self) -> None:
        if self.dirty:
            os.fdatasync(self._fd)
            self.dirty = False
            self.synced_index = self._entries[-1][1] if self._entries else 0

    # -- term / vote / commit index ---------------------------------------------------------------
    def _read_meta(self) -> dict[str, Any]:
        try:
            with open(self._meta_path, "rb") as f:
                meta = pickle.loads(f.read())
            return meta if isinstance(meta, dict) else {}
        except FileNotFoundError:
            return {}

    def _store_meta_now(self) -> None:
        write_durably(self._meta_path, pickle.dumps(self._meta, protocol=5))
        self.stats.meta_syncs += 1
        self._meta_dirty = False

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        if self._meta.get("raftCommitIndex") != raftCommitIndex:
            self._meta["raftCommitIndex"] = raftCommitIndex
            self._meta_dirty = True

    def getRaftCommitIndex(self) -> int:
        return int(self._meta.get("raftCommitIndex", 1))

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        # Raft: term and vote must be durable before any message that reflects them is sent.
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = votedForNodeId
        self._run(self._store_meta_now)

    def getCurrentTerm(self) -> int:
        return int(self._meta.get("currentTerm", 0))

    def getVotedForNodeId(self) -> Any:
        return self._meta.get("votedForNodeId")

    def onOneSecondTimer(self) -> None:
        if self._meta_dirty:
            self._run(self._store_meta_now)


class DurableTransport(TCPTransport):
    """A follower's ack leaves only once the entries it acknowledges are synced."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self.journal: DurableJournal = syncObj.doq_journal
        self._held: list[tuple[Any, dict[str, Any]]] = []

    def send(self, node: Any, message: Any) -> bool:
        if message.get("type") == "next_node_idx" and message.get("success"):
            acked = message["next_node_idx"] - 1
            if acked > self.journal.synced_index or self.journal.dirty:
                self._held.append((node, message))
                self.journal.stats.acks_held += 1
                return True
            return self._send_ack(node, message)
        if self._held and any(n == node for n, _ in self._held):
            self.release_acks()                 # keep per-peer message order
        return super().send(node, message)

    def _send_ack(self, node: Any, message: dict[str, Any]) -> bool:
        if message["next_node_idx"] - 1 > self.journal.synced_index:
            self.journal.stats.acks_unsynced += 1
        self.journal.stats.acks_sent += 1
        return super().send(node, message)

    def release_acks(self) -> None:
        """Sync once, then send every held ack."""
        if not self._held:
            return
        self.journal.sync()
        held, self._held = self._held, []
        for node, message in held:
            self._send_ack(node, message)


# PySyncObj builds its journal inside SyncObj.__init__ through a module-level factory; route
# the paths we registered to DurableJournal and leave everything else as it was.
_registered: dict[str, DurableJournal] = {}
_registry_lock = threading.Lock()
_original_create = _syncobj.createJournal


def register_journal(journal: DurableJournal) -> None:
    with _registry_lock:
        _registered[journal.path] = journal


def _create_journal(journalFile: str | None = None) -> Any:
    with _registry_lock:
        journal = _registered.pop(journalFile, None) if journalFile else None
    return journal if journal is not None else _original_create(journalFile)


_syncobj.createJournal = _create_journal
