"""LMDB implementation of the Store contract (L1).

One writer: every write transaction is opened by the state machine's apply path, which runs in a
single OS thread (LMDB write transactions belong to the thread that opened them). The
environment is opened with ``sync=True`` and ``metasync=False``: data pages are fsynced at each
commit and the meta page with the next one, so a system crash can at most undo the last
transaction, which the Raft journal replays (the applied index lives in the same transaction).
"""
from __future__ import annotations

import hashlib
import logging
import os
from contextlib import contextmanager
from typing import Iterator

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
        return self.txn.get(key, db=self._dbs[db])

    def put(self, db: str, key: bytes, value: bytes) -> None:
        self.txn.put(key, value, db=self._dbs[db])

    def delete(self, db: str, key: bytes) -> bool:
        return bool(self.txn.delete(key, db=self._dbs[db]))

    def items(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        cursor = self.txn.cursor(db=self._dbs[db])
        if not cursor.set_range(prefix):
            return
        for key, value in cursor:
            if not key.startswith(prefix):
                return
            yield key, value

    def delete_prefix(self, db: str, prefix: bytes) -> int:
        cursor = self.txn.cursor(db=self._dbs[db])
        removed = 0
        if not cursor.set_range(prefix):
            return 0
        while cursor.key().startswith(prefix):
            removed += 1
            if not cursor.delete():
                break
        return removed


class LmdbStore:
    def __init__(self, path: str, map_size: int = DEFAULT_MAP_SIZE) -> None:
        self.path = path
        self.map_size = map_size
        os.makedirs(path, mode=0o700, exist_ok=True)
        self.env: lmdb.Environment
        self._dbs: dict[str, lmdb._Database] = {}
        self.open()

    def open(self) -> None:
        self.env = lmdb.open(self.path, map_size=self.map_size, max_dbs=len(DB_NAMES) + 2,
                             sync=True, metasync=False, readahead=False, max_readers=256)
        self._dbs = {name: self.env.open_db(name.encode()) for name in DB_NAMES}

    def close(self) -> None:
        self.env.close()

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
