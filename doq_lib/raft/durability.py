"""Makes PySyncObj acknowledge only what is on disk (docs/ARCHITECTURE.md, Durability retrofit).

PySyncObj 0.3.17 never fsyncs: its journal is an mmap nobody flushes, a follower acknowledges
appended entries as soon as they are in memory, and the leader counts itself toward the majority
unconditionally. This module retrofits durability:

* :class:`DurableJournal` — an append-only journal file of CRC-protected records (a torn tail
  after a crash is detected and cut off) whose ``sync()`` fdatasyncs it and advances
  ``synced_index``; term and vote are stored with write + fsync + rename + directory fsync
  before PySyncObj sends any message that depends on them.
* :class:`DurableTransport` — holds back a follower's successful ``next_node_idx`` (its ack)
  until the journal is synced past the acknowledged index. Acks are cumulative, so releasing
  sends only the newest synced one per peer; a log truncation drops every held ack.
* Group sync: ``start_sync()`` fdatasyncs everything appended so far without blocking the
  event loop (``background``: native AIO or a worker thread) while Raft keeps running;
  completion advances ``synced_index`` and calls ``on_synced`` (the node wakes its tick to
  release acks). One fsync covers every entry appended before it started.
* The leader's own vote: the node's tick (:mod:`doq_lib.raft.tick`) counts the leader toward
  the majority of an index only once ``synced_index`` covers it.
"""
from __future__ import annotations

import errno
import logging
import os
import pickle
import struct
import threading
import time
import zlib
from typing import Any, Callable, NoReturn

import gevent.event

from doq_lib.raft.engine import FAIL_REASON, LOGGER, Journal, set_journal_factory
from doq_lib.raft.wire import WireTransport, loads_command

log = logging.getLogger(__name__)

MAGIC = b"DOQJRNL1"
MEMBERSHIP = b"\x02"                  # first byte of PySyncObj's configuration-change entries
_HEAD = struct.Struct("<IQQI")        # command length, index, term, crc32 of the rest
Runner = Callable[..., Any]
# background(fn, args, done): run fn(*args) in a worker thread, then call done(ok) in the loop
Background = Callable[[Callable[..., Any], tuple[Any, ...], Callable[[bool], None]], None]


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
        self.acks_repeated = 0          # identical acks not sent again (see DurableTransport)


class DurableJournal(Journal):  # type: ignore[misc]  # PySyncObj has no annotations
    def __init__(self, path: str, run_blocking: Runner = run_inline,
                 background: Background | None = None) -> None:
        self.path = path
        self._run = run_blocking
        self._background = background
        self.stats = SyncStats()
        self._entries: list[tuple[bytes, int, int]] = []
        self._offsets: list[int] = []
        self.dirty = False
        self.syncing = False
        self.synced_index = 0
        self.on_synced: Callable[[], None] | None = None
        self.on_truncate: Callable[[], None] | None = None
        # fault injection (tests): a sync that succeeded is treated as failed when this says so
        self.sync_fails: Callable[[], bool] = lambda: False
        self.write_fails: Callable[[], bool] = lambda: False    # fault injection: EIO
        self._epoch = 0                  # bumped by truncation: an older sync result is void
        self._appending_term: int | None = None     # set while an append_entries is processed
        self._pending: int | None = None            # deferred truncation point
        self._sync_done: gevent.event.Event | None = None   # waiters for the running sync
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
    # -- Raft §5.3 truncation -------------------------------------------------------------------
    # PySyncObj truncates a follower's log after prevLogIdx on every append_entries and then
    # re-adds the entries, even when they are the ones it already has (which happens whenever a
    # stale reset makes the leader resend). Rewriting them would put already-acknowledged
    # entries at risk and void a running fsync, so while an append is processed the truncation
    # is deferred: an identical entry (same index and term) is kept as it is, the log is cut at
    # the first real conflict, and what remains after the new entries is kept only if this same
    # leader wrote it (its term) and it holds no configuration change.
    def begin_append(self, leader_term: int) -> None:
        self._appending_term = leader_term
        self._pending = None

    def end_append(self) -> None:
        pending, term = self._pending, self._appending_term
        self._pending = self._appending_term = None
        if pending is None or pending >= len(self._entries):
            return
        if all(e[2] == term and e[0][:1] != MEMBERSHIP for e in self._entries[pending:]):
            return
        self._truncate(pending)

    def add(self, command: bytes, idx: int, term: int) -> None:
        pending = self._pending
        if pending is not None:
            if pending < len(self._entries) and self._entries[pending][1:] == (idx, term):
                self._pending = pending + 1          # already here: nothing to rewrite
                return
            self._pending = None
            self._truncate(pending)                  # the first conflict: cut here
        record = self._record(command, idx, term)
        written = self._write_op("append", os.pwrite, self._fd, record, self._end)
        if written != len(record):
            self._fail_write("append", OSError(errno.ENOSPC, f"short write: {written} of "
                                                             f"{len(record)} bytes"))
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._end += len(record)
        self.dirty = True

    def clear(self) -> None:
        self._truncate(0)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        if self._appending_term is not None:
            self._pending = entryFrom if self._pending is None else min(self._pending, entryFrom)
            return
        self._truncate(entryFrom)

    def _truncate(self, position: int) -> None:
        if position >= len(self._entries):
            return
        self._end = self._offsets[position]
        del self._entries[position:]
        del self._offsets[position:]
        self._write_op("truncate", os.ftruncate, self._fd, self._end)
        last = self._entries[-1][1] if self._entries else 0
        if last < self.synced_index:
            log.warning("journal: entries after %d replaced by the leader's", last)
        self.synced_index = min(self.synced_index, last)
        self.dirty = True
        self._epoch += 1
        if self.on_truncate is not None:
            self.on_truncate()

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Log compaction: keep entries from ``entryTo`` on, rewritten into a fresh file.

        The directory is fsynced first: PySyncObj has just renamed the new snapshot into place
        and that rename must be durable before the entries it covers disappear.
        """
        self._write_op("compaction", self._compact, entryTo)
        os.close(self._fd)
        self._entries, self._offsets, self.dirty = [], [], False
        self._open()

    def _compact(self, entryTo: int) -> None:
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

    # -- write errors ------------------------------------------------------------------------------
    def _write_op(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one of the journal's writes; any error stops the node (:meth:`_fail_write`)."""
        try:
            if self.write_fails():
                raise OSError(errno.EIO, "Input/output error (injected)")
            return fn(*args)
        except OSError as exc:
            self._fail_write(what, exc)

    def _fail_write(self, what: str, exc: OSError) -> NoReturn:
        """A journal write that failed (EIO, ENOSPC, a short write): what is on disk is no
        longer what this node holds in memory, and going on could acknowledge an entry, a term
        or a vote that is not stored. Stop the node, as after a failed sync; on restart the
        journal is read back (a torn tail is cut by its checksums) and the leader sends what is
        missing."""
        log.critical("journal %s: %s failed (%s); stopping this node (fail-stop: nothing is "
                     "acknowledged after a failed journal write)", self.path, what, exc)
        logging.shutdown()
        os._exit(71)

    @property
    def size_bytes(self) -> int:
        """Bytes of the journal file (the entries are held in memory too)."""
        return self._end

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        if self._fd >= 0:
            if self.dirty or self.syncing:
                self.sync_now()
            # stopping anyway: a failure here is raised to the caller, which says so and
            # exits non-zero (not the fail-stop of a running node)
            write_durably(self._meta_path, pickle.dumps(self._meta, protocol=5))
            self.stats.meta_syncs += 1
            self._meta_dirty = False
            os.close(self._fd)
            self._fd = -1

    def flush(self) -> None:
        self.sync()

    # -- durability --------------------------------------------------------------------------------
    def start_sync(self) -> None:
        """Begin an fdatasync of everything appended so far, unless one is running."""
        if self.syncing or not self.dirty:
            return
        target = self._entries[-1][1] if self._entries else 0
        epoch, started = self._epoch, time.perf_counter()
        self.dirty = False
        self.syncing = True

        def done(ok: bool) -> None:
            self.syncing = False
            self.stats.syncs += 1
            self.stats.sync_seconds += time.perf_counter() - started
            if not ok or self.sync_fails():
                self._fail_stop(target)
            if epoch == self._epoch:
                self.synced_index = max(self.synced_index, target)
            else:
                self.dirty = True                          # truncated meanwhile: sync again
            if self._sync_done is not None:
                self._sync_done.set()
            if self.on_synced is not None:
                self.on_synced()

        if self._background is None:
            os.fdatasync(self._fd)
            done(True)
        else:
            self._background(os.fdatasync, (self._fd,), done)

    def _fail_stop(self, target: int) -> NoReturn:
        """A failed fdatasync: the kernel may have dropped the dirty pages and marked them
        clean, so a later sync that succeeds proves nothing about these entries. Never
        acknowledge them: stop the node. On restart the journal is read back from disk and
        the leader sends what is missing."""
        log.critical("journal %s: fdatasync failed up to entry %d; stopping this node "
                     "(fail-stop: entries whose sync failed are never acknowledged)",
                     self.path, target)
        logging.shutdown()
        os._exit(71)

    def wait_synced(self) -> None:
        """Return once every entry appended so far is on disk."""
        while self.dirty or self.syncing:
            self.start_sync()
            if self.syncing:
                if self._sync_done is None:
                    self._sync_done = gevent.event.Event()
                self._sync_done.clear()
                self._sync_done.wait()

    def sync(self) -> None:
        self.wait_synced()

    def sync_now(self) -> None:
        """Synchronous fsync for shutdown (no event loop needed)."""
        try:
            os.fdatasync(self._fd)
        except OSError:
            self._fail_stop(self._entries[-1][1] if self._entries else 0)
        self.dirty = False
        self.synced_index = self._entries[-1][1] if self._entries else 0

    # -- term / vote / commit index ---------------------------------------------------------------
    def _read_meta(self) -> dict[str, Any]:
        try:
            with open(self._meta_path, "rb") as f:
                meta = loads_command(f.read())
            return meta if isinstance(meta, dict) else {}
        except FileNotFoundError:
            return {}

    def _store_meta_now(self) -> None:
        self._write_op("term and vote", write_durably, self._meta_path,
                       pickle.dumps(self._meta, protocol=5))
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


class DurableTransport(WireTransport):
    """A follower's ack leaves only once the entries it acknowledges are synced."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self.journal: DurableJournal = syncObj.doq_journal
        self.journal.on_truncate = self.drop_acks
        self._held: dict[Any, list[tuple[int, dict[str, Any]]]] = {}
        self.last_leader_contact = 0.0         # monotonic time of the last append_entries
        self._last_ack: dict[Any, tuple[int, float]] = {}   # peer -> (next index, when sent)
        self.ack_repeat_after = 0.05           # seconds; the node sets half a heartbeat

    def send(self, node: Any, message: Any) -> bool:
        if message.get("type") == "next_node_idx" and message.get("success"):
            acked = message["next_node_idx"] - 1
            if acked > self.journal.synced_index or node in self._held:
                self._held.setdefault(node, []).append((acked, message))
                self.journal.stats.acks_held += 1
                self.journal.start_sync()
                return True
            return self._send_ack(node, message)
        sent: bool = super().send(node, message)
        if not sent and message.get("type") == "apply_command" and "request_id" in message:
            self._unsent_command(message["request_id"])
        return sent

    def _unsent_command(self, request_id: int) -> None:
        """A command for the leader could not even be sent (no connection): fail it now as a
        definite refusal. PySyncObj would leave it waiting and later report "leader changed",
        which callers must treat as an unknown outcome."""
        waiting = self.raft_node.raft.waiting_reply
        callback = waiting.pop(request_id, None)
        if callback is not None:
            callback(None, FAIL_REASON.MISSING_LEADER)

    def message_received(self, node: Any, message: Any) -> None:
        """Keep the leader's optimistic nextIndex when an older success ack arrives.

        With pipelined appends (and acks released after a group fsync) an ack often names an
        index below what the leader has already sent; PySyncObj would move nextIndex back to
        it and resend entries the follower has, which makes the follower truncate and rewrite
        them. The consistency check still catches lost entries: the follower answers a
        ``reset`` and PySyncObj rewinds then.
        """
        kind = message.get("type")
        if kind == "append_entries":
            self.last_leader_contact = time.monotonic()
        if kind == "append_entries" and "prevLogIdx" in message:
            self.journal.begin_append(message["term"])
            try:
                super().message_received(node, message)
            finally:
                self.journal.end_append()
            return
        if kind != "next_node_idx" or not message.get("success") or message.get("reset"):
            super().message_received(node, message)
            return
        next_index = self.raft_node.raft.next_index
        before = next_index.get(node)
        super().message_received(node, message)
        after = next_index.get(node)
        if before is not None and after is not None and after < before:
            next_index[node] = before

    def _send_ack(self, node: Any, message: dict[str, Any]) -> bool:
        # The same ack again within a short while tells the leader nothing (acks are
        # cumulative): e.g. the answer to the append that only carries the new commit index.
        now = time.monotonic()
        last = self._last_ack.get(node)
        if last is not None and last[0] == message["next_node_idx"] and \
                now - last[1] < self.ack_repeat_after:
            self.journal.stats.acks_repeated += 1
            return True
        self._last_ack[node] = (message["next_node_idx"], now)
        if message["next_node_idx"] - 1 > self.journal.synced_index:
            self.journal.stats.acks_unsynced += 1
        self.journal.stats.acks_sent += 1
        sent: bool = super().send(node, message)
        return sent

    def release_acks(self) -> None:
        """Send, per peer, the newest held ack that the journal now covers (acks are cumulative)."""
        synced = self.journal.synced_index
        for node in list(self._held):
            held = self._held[node]
            ready = [m for acked, m in held if acked <= synced]
            if not ready:
                continue
            rest = held[len(ready):]
            if rest:
                self._held[node] = rest
            else:
                del self._held[node]
            self._send_ack(node, ready[-1])

    def drop_acks(self) -> None:
        """The log was truncated: held acks may name entries that are gone. Peers re-ask."""
        self._held.clear()

    def held_acks(self) -> int:
        return sum(len(v) for v in self._held.values())


class _FalseTruncationAlarm(logging.Filter):
    """PySyncObj warns before *every* truncation of applied entries; DOQ's journal defers them
    and only cuts real conflicts (logged above), so that warning is a false alarm here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("truncating already-applied log entries")


logging.getLogger(LOGGER).addFilter(_FalseTruncationAlarm())


# PySyncObj builds its journal inside SyncObj.__init__; the paths registered here get their
# DurableJournal, any other path what PySyncObj would build.
_registered: dict[str, DurableJournal] = {}
_registry_lock = threading.Lock()


def register_journal(journal: DurableJournal) -> None:
    with _registry_lock:
        _registered[journal.path] = journal


def _create_journal(path: str | None, pysyncobj_factory: Callable[[str | None], Any]) -> Any:
    with _registry_lock:
        journal = _registered.pop(path, None) if path else None
    return journal if journal is not None else pysyncobj_factory(path)


set_journal_factory(_create_journal)
