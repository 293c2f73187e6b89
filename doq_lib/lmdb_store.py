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
from contextlib import contextmanager
from typing import Iterator, cast

import lmdb

from doq_lib.store import DB_NAMES, U64

log = logging.getLogger(__name__)
DEFAULT_MAP_SIZE = 1 << 36


class LmdbTxn:
    """A transaction addressed by database name."""

    __slots__ = ("txn", "_dbs")

    def __init__(self, txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> None:
        self.txn = txn
        self._dbs = dbs

    def get(self, db: str, key: bytes) -> bytes | None:
        # Every transaction is opened with buffers=False: keys and values are bytes.
        return cast("bytes | None", self.txn.get(key, db=self._dbs[db]))

    def put(self, db: str, key: bytes, value: bytes) -> None:
        self.txn.put(key, value, db=self._dbs[db])

    def delete(self, db: str, key: bytes) -> bool:
        return bool(self.txn.delete(key, db=self._dbs[db]))

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
            if not cursor.delete():
                break
        return removed


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
        self.env = lmdb.open(self.path, map_size=self.map_size, max_dbs=len(DB_NAMES) + 2,
                             sync=self.durable, metasync=False, readahead=False,
                             max_readers=256)
        self._dbs = {name: self.env.open_db(name.encode()) for name in DB_NAMES}

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
            yield LmdbTxn(txn, self._dbs)

    @contextmanager
    def child(self, parent: LmdbTxn) -> Iterator[LmdbTxn]:
        """A nested write transaction: its changes reach ``parent`` only if the block succeeds."""
        with self.env.begin(write=True, parent=parent.txn) as txn:
            yield LmdbTxn(txn, self._dbs)

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
        h = hashlib.sha256()
        with self.read() as txn:
            raw = txn.get("meta", b"applied")
            for name in DB_NAMES:
                if name == "meta" and not include_meta:
                    continue
                for key, value in txn.items(name):
                    h.update(b"%d:%s:%d:" % (len(key), name.encode(), len(value)))
                    h.update(key)
                    h.update(value)
        return (U64.unpack(raw)[0] if raw else 0), h.hexdigest()

    def dump(self) -> dict[str, dict[bytes, bytes]]:
        """Every record, for tests and tools."""
        with self.read() as txn:
            return {name: dict(txn.items(name)) for name in DB_NAMES}

    def copy_to_fd(self, fd: int) -> None:
        """A consistent image of the environment (uses its own read transaction)."""
        self.env.copyfd(fd)
