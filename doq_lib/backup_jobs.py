"""A node's backups and restores (L4): streaming a backup from the store, and a restore through
the log. The file format and its checks are doq_lib/backup.py; the service decides who may
(the leader only) and hands these its store, state machine and proposing functions.
"""
from __future__ import annotations

import logging
import uuid
from typing import IO, Any, Callable, Iterator

import gevent

from doq_lib import backup
from doq_lib import commands as C
from doq_lib.errors import DoqError
from doq_lib.fsm import StateMachine
from doq_lib.lmdb_store import LmdbStore
from doq_lib.log import apply_quietly

log = logging.getLogger(__name__)
RESTORE_CHUNK_BYTES = 512 * 1024      # records per Raft entry of a restore, by size


def stream_backup(store: LmdbStore, since: int, source: str,
                  key: bytes | None) -> tuple[int, Iterator[bytes]]:
    """(last version, the backup file in chunks) of ``store``'s changes after ``since``.

    The chunks are read from one LMDB snapshot in a worker thread each, so the event loop
    never waits on the disk and memory stays bounded. Closing the iterator early (a client
    that went away) releases the snapshot.
    """
    pool = gevent.get_hub().threadpool
    stream = apply_quietly(pool, backup.BackupStream, store, since, source, key)

    def chunks() -> Iterator[bytes]:
        try:
            while chunk := apply_quietly(pool, stream.next_chunk):
                yield chunk
        finally:
            apply_quietly(pool, stream.close)
    return stream.last_version, chunks()


def restore(files: list[IO[bytes]], fsm: StateMachine, run: Callable[..., Any],
            submit: Callable[[C.Op], Any], key: bytes | None) -> dict[str, Any]:
    """Restore backups (each file holds one or more, back to back; all in order) through the
    log: ``run(op, size=...)`` proposes and raises on failure, ``submit(op)`` proposes.

    Everything is read and checked first (BadBackup, Conflict: nothing changes). Then the
    records travel in chunks that replicas stage, and one last entry applies them at once: a
    full backup replaces the whole queue state, incrementals apply on top. A restore cut
    short (leader change, error) leaves the state as it was.
    """
    pool = gevent.get_hub().threadpool
    checker = backup.RecordChecker(fsm.queue_defs())
    parts = [(f, part) for f in files
             for part in apply_quietly(pool, backup.scan, f, key, checker)]
    apply_quietly(pool, checker.finish)
    headers = [part.header for _, part in parts]
    backup.check_chain(headers, fsm.restored_version)
    token = uuid.uuid4().hex
    run(C.restore_begin(token))
    try:
        records = 0
        for f, part in parts:
            it = backup.part_records(f, part, key)
            while True:
                chunk, size = apply_quietly(pool, _take_records, it, RESTORE_CHUNK_BYTES)
                if not chunk:
                    break
                run(C.restore_put(token, chunk), size=size)
                records += len(chunk)
        first, last = headers[0], headers[-1]
        run(C.restore_commit(token, first.kind == "full", first.since, last.last_version,
                             max(h.last_id for h in headers), max(h.next_qid for h in headers)))
    except BaseException:
        try:
            submit(C.restore_abort(token))
        except DoqError:
            pass                       # the next restore drops what was staged anyway
        raise
    log.info("restored %d backup(s), %d records, up to version %d", len(headers), records,
             headers[-1].last_version)
    return {"backups": len(headers), "records": records,
            "last_version": headers[-1].last_version}


def _take_records(it: Iterator[backup.Record], limit: int) -> tuple[list[backup.Record], int]:
    """The next records of ``it`` up to about ``limit`` bytes (runs in a worker thread)."""
    out: list[backup.Record] = []
    size = 0
    for record in it:
        out.append(record)
        size += 16 + len(record[1]) + len(record[2] or b"")
        if size >= limit:
            break
    return out, size
