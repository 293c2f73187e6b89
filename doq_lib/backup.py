"""Backup files (L4): writing them from a store snapshot, reading and checking them.

A backup holds queue state only (queue definitions, messages, delivery and scheduler records,
and the id counters), never Raft internals. The format is documented in docs/BACKUPS.md:

    magic "DOQBACKUP\\n" | u8 format | u32 header length | header (JSON)
    frames: 0x01 PUT  u8 db | u16 key length | u32 value length | key | value
            0x02 DEL  u8 db | u16 key length | key
            0xFE MAC  32-byte HMAC-SHA256 of every byte before this frame (format 2 only)
            0xFF END  u64 records | 32-byte SHA-256 of every byte before this frame

Integers are big-endian. A *full* backup (``since`` 0) has a PUT per record; an *incremental*
one (``since`` = the previous backup's ``last_version`` + 1) has, for every key written or
deleted at versions ``since`` .. ``last_version``, its value at ``last_version`` (PUT) or a
DEL. Restoring a full backup and then its incrementals in order rebuilds the state exactly.

Writing streams from one LMDB read snapshot in chunks (memory stays bounded whatever the
store's size); reading checks every frame and, at the end, the count and the checksum, so a
truncated or damaged file is refused before anything is restored.

A checksum only catches accidents: anyone can compute one. A cluster with a secret signs its
backups (format 2: a MAC frame keyed by the secret) and restores only files signed with the
same secret, and every restore checks each record the way the store will read it
(:class:`RecordChecker`): ids and counters in range, values decodable, every message of a
known queue, fair schedulers' records complete. Nothing is proposed before all of that passed.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import struct
import time
from dataclasses import dataclass
from typing import IO, Any, Iterator

from doq_lib.backup_check import INT63_MAX, BadBackup, RecordChecker
from doq_lib.errors import Conflict, InvalidArgument
from doq_lib.lmdb_store import LmdbStore, LmdbTxn
from doq_lib.store import (
    TRACKED,
    TRACKED_NAMES,
    U64,
    decode_clock,
    decode_queue,
)

MAGIC = b"DOQBACKUP\n"
FORMAT = 1                               # unsigned
SIGNED_FORMAT = 2                        # a MAC frame before the end frame
PUT, DELETE, MAC, END = 0x01, 0x02, 0xFE, 0xFF
_PREFIX = struct.Struct(">BI")           # format, header length
_PUT = struct.Struct(">BHI")             # after the frame type: db code, key and value lengths
_DEL = struct.Struct(">BH")              # after the frame type: db code, key length
MAX_HEADER = 1 << 20
CHUNK = 1 << 20                          # bytes per streamed chunk (about)
DEDUP_WINDOW = 1 << 20                   # keys remembered to skip repeats in an incremental
Record = tuple[int, bytes, "bytes | None"]   # db code, key, value (None: deleted)
__all__ = ["BadBackup", "RecordChecker", "UnrestorableState", "BackupStream", "Header",
           "scan", "records", "part_records", "check_chain"]


class UnrestorableState(InvalidArgument):
    """The store holds a record that a restore would refuse: no backup is written (a file
    that cannot be restored is worse than none)."""

    code = "unrestorable_state"
    http_status = 400


@dataclass(frozen=True)
class Header:
    kind: str                 # "full" or "incremental"
    since: int
    last_version: int
    last_id: int
    next_qid: int
    created_ms: int
    source: str

    def to_json(self, fmt: int = FORMAT) -> bytes:
        return json.dumps({"format": fmt, **self.__dict__}, sort_keys=True).encode()


# -- writing -------------------------------------------------------------------------------------

class BackupStream:
    """A backup being written from one read snapshot of ``store``.

    Raises Conflict if ``since`` reaches back before the kept change history, InvalidArgument
    if it is past the newest version. ``chunks()`` yields the file; ``close()`` (also called
    when the iteration ends) releases the snapshot. Not thread-safe: one consumer at a time,
    from any one thread at a time.
    """

    def __init__(self, store: LmdbStore, since: int, source: str,
                 key: bytes | None = None) -> None:
        self._mac = hmac.new(key, digestmod=hashlib.sha256) if key else None
        self._format = SIGNED_FORMAT if key else FORMAT
        self._txn: LmdbTxn | None = store.begin_read()
        try:
            txn = self._txn
            meta = dict(txn.items("meta"))
            last = U64.unpack(meta[b"applied"])[0] if b"applied" in meta else 0
            _, last_id = decode_clock(meta.get(b"clock"))
            next_qid = U64.unpack(meta[b"next_qid"])[0] if b"next_qid" in meta else 1
            if since > last + 1:
                raise InvalidArgument(f"since {since} is after the newest version {last}: "
                                      f"the next incremental backup starts at {last + 1} at most")
            if since > 0:
                kept = txn.history_from()
                kept = 1 if kept is None else kept
                if since < kept:
                    raise Conflict(f"changes before version {kept} are no longer kept "
                                   f"(backup.history_seconds): take a full backup (since 0)")
            self.header = Header("full" if since == 0 else "incremental", since, last, last_id,
                                 next_qid, int(time.time() * 1000), source)
            self._check(since)
        except BaseException:
            self.close()
            raise
        self._records = self._full() if since == 0 else self._incremental(since)
        self._hash = hashlib.sha256()
        self._count = 0
        self._started = False
        self._done = False

    @property
    def last_version(self) -> int:
        return self.header.last_version

    def close(self) -> None:
        if self._txn is not None:
            self._txn.txn.abort()
            self._txn = None

    def _check(self, since: int) -> None:
        """Read every record the backup will carry and check it as a restore will, so that
        what the store holds is backed up whole or refused now, never refused at restore
        time. (One more pass over the snapshot: a few µs per record.)"""
        assert self._txn is not None
        existing = {} if since == 0 else {
            defn.qid: defn for defn in (decode_queue(key.decode("utf-8", "replace"), value)
                                        for key, value in self._txn.items("queues"))}
        checker = RecordChecker(existing)
        checker.start(self.header)
        try:
            for code, key, value in self._full() if since == 0 else self._incremental(since):
                checker.check(code, key, value)
            checker.finish()
        except BadBackup as exc:
            raise UnrestorableState(
                "no backup was taken: the store holds a record that a restore would refuse "
                f"({exc.message.removeprefix('invalid: ')})") from None

    def _full(self) -> Iterator[Record]:
        assert self._txn is not None
        for name, code in TRACKED.items():
            for key, value in self._txn.items(name):
                yield code, key, value

    def _incremental(self, since: int) -> Iterator[Record]:
        txn = self._txn
        assert txn is not None
        seen: set[tuple[int, bytes]] = set()
        for _, code, key in txn.changes(since):
            if (code, key) in seen:
                continue
            if len(seen) >= DEDUP_WINDOW:
                seen.clear()              # bounded memory; a repeat is harmless, only larger
            seen.add((code, key))
            yield code, key, txn.get(TRACKED_NAMES[code], key)

    def next_chunk(self) -> bytes:
        """The next piece of the file (about CHUNK bytes); b"" once it is complete."""
        if self._done:
            return b""
        out = bytearray()
        if not self._started:
            self._started = True
            header = self.header.to_json(self._format)
            out += MAGIC + _PREFIX.pack(self._format, len(header)) + header
        for code, key, value in self._records:
            if value is None:
                out += bytes((DELETE,)) + _DEL.pack(code, len(key)) + key
            else:
                out += bytes((PUT,)) + _PUT.pack(code, len(key), len(value)) + key + value
            self._count += 1
            if len(out) >= CHUNK:
                self._digest(out)
                return bytes(out)
        self._digest(out)
        if self._mac is not None:
            frame = bytes((MAC,)) + self._mac.digest()
            self._hash.update(frame)
            out += frame
        out += bytes((END,)) + U64.pack(self._count) + self._hash.digest()
        self._done = True
        self.close()
        return bytes(out)

    def _digest(self, data: bytearray) -> None:
        self._hash.update(data)
        if self._mac is not None:
            self._mac.update(data)

    def chunks(self) -> Iterator[bytes]:
        try:
            while chunk := self.next_chunk():
                yield chunk
        finally:
            self.close()


# -- reading -------------------------------------------------------------------------------------

class _Reader:
    """Exact reads from a binary file, hashing what it reads and counting the offset."""

    def __init__(self, f: IO[bytes], key: bytes | None = None) -> None:
        self.f = f
        self.offset = 0
        self.hash = hashlib.sha256()
        self.mac = hmac.new(key, digestmod=hashlib.sha256) if key else None

    def take(self, n: int, what: str, hashed: bool = True) -> bytes:
        data = self.f.read(n)
        while len(data) < n:
            more = self.f.read(n - len(data))
            if not more:
                raise BadBackup(f"truncated: the file ends inside {what} at byte "
                                f"{self.offset + len(data)}")
            data += more
        if hashed:
            self.hash.update(data)
            if self.mac is not None:
                self.mac.update(data)
        self.offset += n
        return data


def read_header(f: IO[bytes], key: bytes | None = None) -> tuple[Header, _Reader, int]:
    """The header, the reader positioned after it, and the file's format."""
    r = _Reader(f, key)
    magic = f.read(len(MAGIC))
    if magic != MAGIC:
        raise BadBackup("not a DOQ backup file (it does not start with the DOQ backup "
                        "signature)")
    r.hash.update(magic)
    if r.mac is not None:
        r.mac.update(magic)
    r.offset = len(MAGIC)
    fmt, length = _PREFIX.unpack(r.take(_PREFIX.size, "the header"))
    if fmt not in (FORMAT, SIGNED_FORMAT):
        raise BadBackup(f"backup format {fmt} is not supported (this version reads "
                        f"{FORMAT} and {SIGNED_FORMAT})")
    if length > MAX_HEADER:
        raise BadBackup(f"damaged: header length {length} is implausible")
    try:
        raw: dict[str, Any] = json.loads(r.take(length, "the header"))
        header = Header(kind=raw["kind"], since=int(raw["since"]),
                        last_version=int(raw["last_version"]), last_id=int(raw["last_id"]),
                        next_qid=int(raw["next_qid"]), created_ms=int(raw["created_ms"]),
                        source=str(raw.get("source", "")))
    except BadBackup:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise BadBackup(f"damaged: the header cannot be read ({exc})") from None
    if header.kind not in ("full", "incremental") or (header.kind == "full") != (
            header.since == 0) or header.since < 0 or header.last_version < 0:
        raise BadBackup("damaged: the header is inconsistent")
    for name in ("since", "last_version", "last_id", "next_qid"):
        if not 0 <= getattr(header, name) <= INT63_MAX:
            raise BadBackup(f"invalid: header field {name} is out of range "
                            f"(0 .. 2^63-1): {getattr(header, name)}")
    if header.next_qid < 1:
        raise BadBackup("invalid: header field next_qid must be at least 1")
    return header, r, fmt


UNSIGNED = ("the backup is not signed: this cluster has a cluster secret and restores only "
            "backups signed with it (taken from a cluster with the same raft.password)")
BAD_SIGNATURE = ("the backup's signature does not match: the file was changed after it was "
                 "written, or it was signed with another cluster secret")


def records(f: IO[bytes], key: bytes | None = None) -> Iterator[Header | Record]:
    """The header, then every record of the backup that starts at the file's position; raises
    BadBackup on anything but an intact backup (the checksum is verified last, so consume
    everything before trusting any record). Stops right after the backup's end frame.

    With ``key`` (the cluster's backup key) the file must be signed with it."""
    header, r, fmt = read_header(f, key)
    if key is not None and fmt != SIGNED_FORMAT:
        raise BadBackup(UNSIGNED)
    yield header
    count = 0
    signed = False
    while True:
        kind = r.take(1, "a frame", hashed=False)[0]
        if kind == MAC and fmt == SIGNED_FORMAT and not signed:
            expected = r.mac.digest() if r.mac is not None else None
            digest = r.take(32, "the signature frame", hashed=False)
            r.hash.update(bytes((MAC,)) + digest)
            if expected is not None and not hmac.compare_digest(digest, expected):
                raise BadBackup(BAD_SIGNATURE)
            signed = True
            continue
        if kind == END and fmt == SIGNED_FORMAT and not signed:
            raise BadBackup("damaged: the signature frame is missing")
        if kind == END:
            expected = U64.unpack(r.take(U64.size, "the end frame", hashed=False))[0]
            digest = r.take(32, "the end frame", hashed=False)
            if expected != count:
                raise BadBackup(f"damaged: {count} records read, the file says {expected}")
            if digest != r.hash.digest():
                raise BadBackup("damaged: the checksum does not match the contents")
            return
        r.hash.update(bytes((kind,)))
        if r.mac is not None:
            r.mac.update(bytes((kind,)))
        if kind == PUT:
            code, klen, vlen = _PUT.unpack(r.take(_PUT.size, "a record"))
            rkey = r.take(klen, "a record")
            value: bytes | None = r.take(vlen, "a record")
        elif kind == DELETE:
            code, klen = _DEL.unpack(r.take(_DEL.size, "a record"))
            rkey, value = r.take(klen, "a record"), None
        else:
            raise BadBackup(f"damaged: unknown frame type {kind} at byte {r.offset - 1}")
        if signed:
            raise BadBackup("damaged: records after the signature frame")
        if code not in TRACKED_NAMES or not rkey:
            raise BadBackup(f"damaged: bad record at byte {r.offset}")
        count += 1
        yield code, rkey, value


@dataclass(frozen=True)
class Part:
    """One backup found in a file (a file may hold several, one after the other)."""

    header: Header
    offset: int
    records: int


def scan(f: IO[bytes], key: bytes | None = None,
         checker: "RecordChecker | None" = None) -> list[Part]:
    """Check a whole seekable file holding one or more backups back to back, and say what
    is in it (BadBackup if any of it is not intact, or if it is empty). ``key``: the file
    must be signed with it; ``checker``: every record must also pass it (its ``finish()`` is
    the caller's, once every file was scanned)."""
    f.seek(0)
    parts: list[Part] = []
    while True:
        offset = f.tell()
        if not f.read(1):
            break
        f.seek(offset)
        it = records(f, key)
        try:
            header = next(it)
            assert isinstance(header, Header)
            if checker is not None:
                checker.start(header)
            count = 0
            invalid: BadBackup | None = None     # reported once the checksum proved intact
            for record in it:
                assert not isinstance(record, Header)
                if checker is not None and invalid is None:
                    try:
                        checker.check(*record)
                    except BadBackup as exc:
                        invalid = exc
                count += 1
            if invalid is not None:
                raise invalid
        except BadBackup as exc:
            where = f" (backup {len(parts) + 1} in the file)" if parts else ""
            raise BadBackup(exc.message + where) from None
        parts.append(Part(header, offset, count))
    if not parts:
        raise BadBackup("the backup file is empty")
    return parts


def part_records(f: IO[bytes], part: Part, key: bytes | None = None) -> Iterator[Record]:
    """The records of one part found by scan() (read, and checked, again)."""
    f.seek(part.offset)
    it = records(f, key)
    next(it)
    for item in it:
        assert not isinstance(item, Header)
        yield item


def check_chain(headers: list[Header], restored: int | None,
                follow_restore: bool = True) -> None:
    """Refuse (Conflict) a sequence of backups that does not follow on from itself or, when it
    starts with an incremental backup (and ``follow_restore``), from the last restore made
    here (``restored``: the version it ended at)."""
    first = headers[0]
    if follow_restore and first.kind == "incremental" and restored != first.since - 1:
        ended = ("no restore was made here" if restored is None
                 else f"the last restore here ended at version {restored}")
        raise Conflict(f"the incremental backup from version {first.since} must follow the "
                       f"restore that ended at version {first.since - 1}, but {ended}")
    for n, (prev, cur) in enumerate(zip(headers, headers[1:]), start=2):
        if cur.kind != "incremental":
            raise Conflict(f"backup {n} is a full backup: only the first one may be")
        if cur.since != prev.last_version + 1:
            raise Conflict(f"backup {n} starts at version {cur.since} but backup {n - 1} "
                           f"ends at version {prev.last_version}: give them in order, "
                           f"none missing")
