"""Snapshots (log compaction) that work with LMDB (docs/ARCHITECTURE.md, Snapshots and log
compaction).

A snapshot file is ``MAGIC | u64 n | pickle(raft data, n bytes) | LMDB image``. PySyncObj calls
the serializer synchronously inside its tick, and copying a large LMDB there would stall
heartbeats, so serialization is asynchronous (PySyncObj's ``serializeChecker`` protocol):

1. ``serialize`` keeps the previous snapshot in place (hard link as PySyncObj's temp file, which
   it renames over the real one), waits for the apply pipeline to drain (so the image covers at
   least the snapshot index), and copies the environment in a background OS thread;
2. the copy is fsynced and renamed over the snapshot, then the checker reports success and
   PySyncObj truncates the journal (which fsyncs the directory first).

The image may be newer than the snapshot index: entries replayed on top of it are skipped by
the state machine (applied index). ``deserialize`` keeps the live LMDB when it is at least as new
as the snapshot (normal restart) and swaps in the image otherwise (a follower catching up).
"""
from __future__ import annotations

import logging
import os
import pickle
import shutil
import struct
from typing import Any

import gevent.threadpool

from doq_lib.fsm import StateMachine
from doq_lib.lmdb_store import LmdbStore
from doq_lib.raft.durability import fsync_dir
from doq_lib.raft.engine import SERIALIZER_STATE
from doq_lib.raft.pipeline import ApplyPipeline
from doq_lib.raft.wire import loads_command

log = logging.getLogger(__name__)
MAGIC = b"DOQSNAP1"
PENDING = b"DOQSNAP0"     # placeholder while the very first snapshot is being written
_LEN = struct.Struct(">Q")


def snapshot_path(node_dir: str) -> str:
    return os.path.join(node_dir, "raft", "snapshot.bin")


def read_header(path: str) -> tuple[Any, int]:
    """(PySyncObj's raft data, offset of the LMDB image) of a finished snapshot file."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError(f"{path}: not a finished DOQ snapshot")
        (length,) = _LEN.unpack(f.read(_LEN.size))
        return loads_command(f.read(length)), f.tell()


def extract_image(path: str, offset: int, directory: str) -> None:
    """Write the LMDB image of a snapshot as ``directory``/data.mdb (fsynced)."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    with open(path, "rb") as src, open(os.path.join(directory, "data.mdb"), "wb") as dst:
        src.seek(offset)
        shutil.copyfileobj(src, dst, 1 << 20)
        dst.flush()
        os.fsync(dst.fileno())


def recover_store(node_dir: str, store: LmdbStore) -> None:
    """Rebuild an untrusted store: the last snapshot's image (or nothing), then the journal.

    The journal keeps every entry after the snapshot, and entries at or below the image's
    applied index are skipped when replayed, so the result is exactly the committed state.
    """
    path = snapshot_path(node_dir)
    try:
        _, offset = read_header(path)
    except (OSError, ValueError):
        log.warning("store untrusted after a system crash: rebuilding from the journal")
        store.wipe()
        return
    log.warning("store untrusted after a system crash: restoring snapshot, replaying journal")
    store.close()
    staging = store.path + ".incoming"
    extract_image(path, offset, staging)
    for name in ("data.mdb", "lock.mdb"):
        try:
            os.unlink(os.path.join(store.path, name))
        except FileNotFoundError:
            pass
    os.replace(os.path.join(staging, "data.mdb"), os.path.join(store.path, "data.mdb"))
    shutil.rmtree(staging, ignore_errors=True)
    fsync_dir(store.path)
    store.open()


class SnapshotManager:
    def __init__(self, path: str, store: LmdbStore, fsm: StateMachine,
                 pipeline: ApplyPipeline) -> None:
        self.path = path
        self.store = store
        self.fsm = fsm
        self.pipeline = pipeline
        self._pool = gevent.threadpool.ThreadPool(1)
        self._state = SERIALIZER_STATE.NOT_SERIALIZING
        self.snapshots_written = 0
        self.snapshots_installed = 0

    # -- PySyncObj hooks -------------------------------------------------------------------------
    def serialize(self, tmp_path: str, raft_data: Any) -> None:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)
        if os.path.exists(self.path):
            os.link(self.path, tmp_path)
        else:
            with open(tmp_path, "wb") as f:
                f.write(PENDING)
        self._state = SERIALIZER_STATE.SERIALIZING
        self.pipeline.when_idle(lambda: self._start_copy(raft_data))

    def _start_copy(self, raft_data: Any) -> None:
        job = self._pool.spawn(self._write, raft_data)
        job.rawlink(self._written)

    def _write(self, raft_data: Any) -> None:
        work = self.path + ".bg"
        meta = pickle.dumps(raft_data, protocol=5)
        with open(work, "wb") as f:
            f.write(MAGIC + _LEN.pack(len(meta)) + meta)
            f.flush()
            self.store.copy_to_fd(f.fileno())
            os.fsync(f.fileno())
        os.replace(work, self.path)
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    def _written(self, job: Any) -> None:
        if job.successful():
            self.snapshots_written += 1
            self._state = SERIALIZER_STATE.SUCCESS
        else:
            log.error("writing snapshot failed: %r", job.exception)
            self._state = SERIALIZER_STATE.FAILED

    def check(self) -> int:
        state: int = self._state
        if state in (SERIALIZER_STATE.SUCCESS, SERIALIZER_STATE.FAILED):
            self._state = SERIALIZER_STATE.NOT_SERIALIZING
        return state

    def deserialize(self, path: str) -> Any:
        raft_data, image_offset = read_header(path)
        snapshot_index = raft_data[0][1]
        self.pipeline.wait_idle()
        if self.fsm.applied_index >= snapshot_index:
            return raft_data          # our LMDB already holds at least this much
        log.warning("installing snapshot at index %d (local state at %d)",
                    snapshot_index, self.fsm.applied_index)
        self._install_image(path, image_offset)
        self.snapshots_installed += 1
        return raft_data

    # -- image swap ------------------------------------------------------------------------------
    def _install_image(self, path: str, offset: int) -> None:
        live = self.store.path
        staging, old = live + ".incoming", live + ".old"
        extract_image(path, offset, staging)
        self.pipeline.run_in_writer(self._swap, live, staging, old)

    def _swap(self, live: str, staging: str, old: str) -> None:
        self.store.close()
        shutil.rmtree(old, ignore_errors=True)
        os.replace(live, old)
        os.replace(staging, live)
        fsync_dir(os.path.dirname(os.path.abspath(live)))
        shutil.rmtree(old, ignore_errors=True)
        self.store.open()
        with self.store.read() as txn:
            self.fsm.reload(txn)
