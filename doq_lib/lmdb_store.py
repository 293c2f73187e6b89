"""LMDB implementation of the Store contract (L1).

One writer: every write transaction is opened by the state machine's apply path, which runs in a
single OS thread (LMDB write transactions belong to the thread that opened them).

The store is a materialized view of the Raft log, which is the durable record (fsynced on a
majority before anything is acknowledged). So by default commits are not fsynced
(``durable=False``): after a process crash the page cache still holds every committed
transaction, and LMDB's copy-on-write commit keeps the file consistent. Only an operating-system
crash can leave an unsynced LMDB file damaged; :meth:`LmdbStore.trusted` detects that case (the
previous run did not close cleanly *and* the machine rebooted since) so the node rebuilds the
store from its last snapshot and replays the journal. ``durable=True`` fsyncs every commit
instead.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from contextlib import contextmanager
from typing import Iterator, cast

import lmdb

from doq_lib.store import (
    CHANGES_DB,
    DB_NAMES,
    HISTORY_FROM,
    MAX_KEY,
    STAGING_DB,
    TIME_CODE,
    TRACKED,
    U64,
    change_key,
    parse_change,
)

log = logging.getLogger(__name__)
DEFAULT_MAP_SIZE = 1 << 36


class Changelog:
    """Where write transactions note which queue-state keys they touch (for incremental
    backups): the state machine sets ``version`` to the Raft index of the entry it applies
    (0 notes nothing); ``pending`` collects db code + key until :meth:`LmdbTxn.flush_changes`
    writes them all at once (one C-level loop instead of a put per write)."""

    __slots__ = ("version", "db", "pending")

    def __init__(self, db: lmdb._Database) -> None:
        self.version = 0
        self.db = db
        self.pending: list[bytes] = []


class LmdbTxn:
    """A transaction addressed by database name."""

    __slots__ = ("txn", "_dbs", "_log")

    def __init__(self, txn: lmdb.Transaction, dbs: dict[str, lmdb._Database],
                 changelog: Changelog | None = None) -> None:
        self.txn = txn
        self._dbs = dbs
        self._log = changelog

    def _note(self, db: str, key: bytes) -> None:
        changelog = self._log
        if changelog is not None and changelog.version:
            code = _CODE_BYTES.get(db)
            if code is not None:
                changelog.pending.append(code + key)

    def flush_changes(self) -> int:
        """Write the change records noted since the version was set; returns how many."""
        changelog = self._log
        if changelog is None or not changelog.pending:
            return 0
        prefix, version = U64.pack(changelog.version), changelog.version
        records = [(prefix + k, b"") if len(k) <= _MAX_NOTED
                   else change_key(version, k[0], k[1:]) for k in changelog.pending]
        changelog.pending = []
        self.txn.cursor(db=changelog.db).putmulti(records)
        return len(records)

    def get(self, db: str, key: bytes) -> bytes | None:
        # Every transaction is opened with buffers=False: keys and values are bytes.
        return cast("bytes | None", self.txn.get(key, db=self._dbs[db]))

    def put(self, db: str, key: bytes, value: bytes) -> None:
        self.txn.put(key, value, db=self._dbs[db])
        if self._log is not None:
            self._note(db, key)

    def delete(self, db: str, key: bytes) -> bool:
        if not self.txn.delete(key, db=self._dbs[db]):
            return False
        if self._log is not None:
            self._note(db, key)
        return True

    def items(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        cursor = self.txn.cursor(db=self._dbs[db])
        if not cursor.set_range(prefix):
            return
        for key, value in cast("Iterator[tuple[bytes, bytes]]", cursor):
            if not key.startswith(prefix):
                return
            yield key, value

    def delete_prefix(self, db: str, prefix: bytes) -> int:
        cursor = self.txn.cursor(db=self._dbs[db])
        removed = 0
        if not cursor.set_range(prefix):
            return 0
        while cast(bytes, cursor.key()).startswith(prefix):
            removed += 1
            if self._log is not None:
                self._note(db, cast(bytes, cursor.key()))
            if not cursor.delete():
                break
        return removed


    # -- change history (incremental backups) ------------------------------------------------------
    def history_mark(self, version: int, now_ms: int) -> None:
        """Record the time of ``version`` (the first record of every version that has changes)."""
        assert self._log is not None
        self.txn.put(U64.pack(version) + bytes((TIME_CODE,)), U64.pack(now_ms), db=self._log.db)

    def history_from(self) -> int | None:
        """The oldest version whose change records are complete; None before the first mark."""
        changelog = self._log
        db = changelog.db if changelog is not None else self._dbs[CHANGES_DB]
        raw = self.txn.get(HISTORY_FROM, db=db)
        return U64.unpack(raw)[0] if raw else None

    def set_history_from(self, version: int) -> None:
        assert self._log is not None
        self.txn.put(HISTORY_FROM, U64.pack(version), db=self._log.db)

    def prune_history(self, cutoff_ms: int, budget: int) -> int:
        """Delete up to ``budget`` change records of versions older than ``cutoff_ms``, oldest
        first, moving ``HISTORY_FROM`` past them; returns how many were deleted."""
        assert self._log is not None
        cursor = self.txn.cursor(db=self._log.db)
        if not cursor.set_range(U64.pack(1)):
            return 0
        removed, horizon = 0, 0
        while removed < budget:
            key = cast(bytes, cursor.key())
            if not key:
                break
            version = U64.unpack_from(key)[0]
            if key[8] == TIME_CODE and U64.unpack(cursor.value())[0] >= cutoff_ms:
                break
            horizon = version + 1
            removed += 1
            if not cursor.delete():
                break
        if horizon and horizon > (self.history_from() or 0):
            self.set_history_from(horizon)
        return removed

    def changes(self, since: int) -> Iterator[tuple[int, int, bytes]]:
        """(version, db code, key) of every change record from version ``since`` on."""
        db = self._log.db if self._log is not None else self._dbs[CHANGES_DB]
        cursor = self.txn.cursor(db=db)
        if not cursor.set_range(U64.pack(max(since, 1))):
            return
        for ckey, cvalue in cast("Iterator[tuple[bytes, bytes]]", cursor):
            if ckey[8] != TIME_CODE:
                yield parse_change(ckey, cvalue)

    # -- restore staging ---------------------------------------------------------------------------
    def stage(self, code: int, key: bytes, value: bytes | None) -> None:
        """Stage a record of a restore (a later one for the same key replaces it)."""
        skey = bytes((code,)) + (key if len(key) <= MAX_KEY - 1 else hashlib.sha256(key).digest())
        body = b"\x00" if value is None else b"\x01" + value
        self.txn.put(skey, _STAGE_HEAD.pack(len(key)) + key + body, db=self._dbs[STAGING_DB])

    def staged(self) -> Iterator[tuple[int, bytes, bytes | None]]:
        """(db code, key, value or None for a deletion) of every staged record."""
        cursor = self.txn.cursor(db=self._dbs[STAGING_DB])
        if not cursor.first():
            return
        for skey, raw in cast("Iterator[tuple[bytes, bytes]]", cursor):
            klen = _STAGE_HEAD.unpack_from(raw)[0]
            pos = _STAGE_HEAD.size
            key, flag = raw[pos:pos + klen], raw[pos + klen]
            yield skey[0], key, (raw[pos + klen + 1:] if flag else None)

    def clear_staging(self) -> None:
        self.txn.drop(self._dbs[STAGING_DB], delete=False)


_STAGE_HEAD = struct.Struct(">H")
_CODE_BYTES = {name: bytes((code,)) for name, code in TRACKED.items()}
_MAX_NOTED = MAX_KEY - 8         # code + key that fits behind the 8-byte version


def boot_id() -> str:
    """Changes on every boot of the machine ('' where the kernel does not tell)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


class LmdbStore:
    MARKER = "doq-store.json"

    def __init__(self, path: str, map_size: int = DEFAULT_MAP_SIZE, durable: bool = False) -> None:
        self.path = path
        self.map_size = map_size
        self.durable = durable
        os.makedirs(path, mode=0o700, exist_ok=True)
        self.env: lmdb.Environment
        self._dbs: dict[str, lmdb._Database] = {}
        self.open()

    def open(self) -> None:
        self.env = lmdb.open(self.path, map_size=self.map_size, max_dbs=len(DB_NAMES) + 4,
                             sync=self.durable, metasync=False, readahead=False,
                             max_readers=256)
        self._dbs = {name: self.env.open_db(name.encode())
                     for name in (*DB_NAMES, CHANGES_DB, STAGING_DB)}
        self.changelog = Changelog(self._dbs[CHANGES_DB])

    def close(self) -> None:
        self.env.close()

    # -- crash trust ------------------------------------------------------------------------------
    def _marker(self) -> str:
        return os.path.join(self.path, self.MARKER)

    def trusted(self) -> bool:
        """Whether the contents can be used as they are after the previous run.

        False only when the previous run did not close cleanly and the machine has rebooted
        since (an operating-system crash may have lost unsynced pages). A durable store, a
        clean close or a mere process crash (the page cache survived) are all trusted.
        """
        try:
            with open(self._marker(), encoding="utf-8") as f:
                marker = json.load(f)
        except (OSError, ValueError):
            return True                  # a new store, or one from before markers existed
        if self.durable or marker.get("clean") or marker.get("durable"):
            return True
        current = boot_id()
        return bool(current) and marker.get("boot_id") == current

    def mark_open(self) -> None:
        """Record (durably) that this run has the store open and may leave it unsynced."""
        self._write_marker({"boot_id": boot_id(), "clean": False, "durable": self.durable})

    def mark_clean(self) -> None:
        """Flush everything, then record a clean close."""
        self.env.sync(True)
        self._write_marker({"boot_id": boot_id(), "clean": True, "durable": self.durable})

    def _write_marker(self, content: dict[str, object]) -> None:
        tmp = self._marker() + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(content, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._marker())
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def wipe(self) -> None:
        """Drop every record (the store is then rebuilt from a snapshot and the journal)."""
        self.env.close()
        for name in ("data.mdb", "lock.mdb"):
            try:
                os.unlink(os.path.join(self.path, name))
            except FileNotFoundError:
                pass
        self.open()

    @contextmanager
    def write(self) -> Iterator[LmdbTxn]:
        with self.env.begin(write=True) as txn:
            yield LmdbTxn(txn, self._dbs, self.changelog)

    @contextmanager
    def child(self, parent: LmdbTxn) -> Iterator[LmdbTxn]:
        """A nested write transaction: its changes reach ``parent`` only if the block succeeds."""
        with self.env.begin(write=True, parent=parent.txn) as txn:
            yield LmdbTxn(txn, self._dbs, self.changelog)

    def begin_read(self) -> LmdbTxn:
        """A read snapshot the caller must end with ``txn.txn.abort()`` (usable from any one
        thread at a time: py-lmdb opens environments without thread-local reader slots)."""
        return LmdbTxn(self.env.begin(buffers=False), self._dbs)

    @contextmanager
    def read(self) -> Iterator[LmdbTxn]:
        with self.env.begin(buffers=False) as txn:
            yield LmdbTxn(txn, self._dbs)

    def grow(self) -> None:
        self.map_size *= 2
        log.warning("LMDB map full: growing map to %d bytes", self.map_size)
        self.env.set_mapsize(self.map_size)

    def applied_index(self) -> int:
        with self.read() as txn:
            raw = txn.get("meta", b"applied")
        return U64.unpack(raw)[0] if raw else 0

    def digest(self, include_meta: bool = True) -> str:
        """SHA-256 over every (database, key, value) in key order: equal contents, equal digest."""
        return self.state(include_meta)[1]

    def state(self, include_meta: bool = True) -> tuple[int, str]:
        """(applied index, digest) read from one consistent snapshot."""
        applied, full, queues = self.digests()
        return applied, full if include_meta else queues

    def digests(self) -> tuple[int, str, str]:
        """(applied index, digest of every record, digest without ``meta``: the queue state),
        both from one pass over one consistent snapshot."""
        full, queues = hashlib.sha256(), hashlib.sha256()
        with self.read() as txn:
            raw = txn.get("meta", b"applied")
            for name in DB_NAMES:
                hashes = (full,) if name == "meta" else (full, queues)
                for key, value in txn.items(name):
                    head = b"%d:%s:%d:" % (len(key), name.encode(), len(value))
                    for h in hashes:
                        h.update(head)
                        h.update(key)
                        h.update(value)
        return (U64.unpack(raw)[0] if raw else 0), full.hexdigest(), queues.hexdigest()

    def dump(self) -> dict[str, dict[bytes, bytes]]:
        """Every record, for tests and tools."""
        with self.read() as txn:
            return {name: dict(txn.items(name)) for name in DB_NAMES}

    def copy_to_fd(self, fd: int) -> None:
        """A consistent image of the environment (uses its own read transaction)."""
        self.env.copyfd(fd)
