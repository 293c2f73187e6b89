"""Command-line tools for operators and scripts (L6): backup, restore, offline reads.

``backup`` and ``restore`` talk to a running cluster over HTTP (the leader is found from any
given node); ``get`` reads a stopped node's store directly. Exit codes, for scripts:

    0  done
    1  refused or failed: the server said no, a file is not an intact backup, bad input
    2  usage or configuration error
    3  no node could be reached, or the cluster has no leader
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import IO, Any, Sequence

import lmdb

from doq_lib import auth
from doq_lib import backup as bk
from doq_lib.client import NO_SECURITY, HttpClient, RetryPolicy, Security
from doq_lib.config import Config
from doq_lib.errors import DoqError, Unavailable
from doq_lib.models import QueueType
from doq_lib.store import U64, decode_message, decode_queue

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
FORMATS = ("text", "json", "jsonl")


def _say(message: str) -> None:
    print(f"doq: {message}", file=sys.stderr)


def _client(urls: Sequence[str], timeout: float,
            security: Security = NO_SECURITY) -> HttpClient:
    return HttpClient(urls, timeout=min(timeout, 30.0),
                      retry=RetryPolicy(attempts=3, deadline=min(timeout, 30.0)),
                      security=security)


def _failure(exc: DoqError) -> int:
    _say(exc.message)
    return EXIT_UNREACHABLE if isinstance(exc, Unavailable) else EXIT_FAILED


# -- backup / restore ------------------------------------------------------------------------------

def run_backup(urls: Sequence[str], output: str, since: int, timeout: float,
               out: IO[str] = sys.stdout, security: Security = NO_SECURITY) -> int:
    """Write a backup to ``output`` (through ``output``.part, checked before it is renamed);
    print the ``--since`` of the next incremental backup on stdout."""
    if since < 0:
        _say("--since must be 0 (full backup) or a version number")
        return EXIT_USAGE
    partial = output + ".part"
    try:
        with _client(urls, timeout, security) as client, open(partial, "wb") as f:
            last = client.backup(f, since, timeout)
        with open(partial, "rb") as f:
            parts = bk.scan(f)
        if len(parts) != 1 or parts[0].header.last_version != last:
            raise bk.BadBackup("the downloaded file does not match what the server announced")
        os.replace(partial, output)
    except DoqError as exc:
        _remove(partial)
        return _failure(exc)
    except OSError as exc:
        _remove(partial)
        _say(f"{output}: {exc.strerror or exc}")
        return EXIT_FAILED
    header = parts[0].header
    _say(f"wrote {header.kind} backup {output}: versions {header.since}..{last}, "
         f"{parts[0].records} records")
    print(last + 1, file=out)
    return EXIT_OK


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def run_restore(urls: Sequence[str], full: str | None, incrementals: Sequence[str],
                timeout: float, out: IO[str] = sys.stdout,
                security: Security = NO_SECURITY) -> int:
    """Check the files locally, then restore them in order through the leader."""
    paths = ([full] if full else []) + [p for item in incrementals for p in item.split(",")
                                         if p]
    if not paths:
        _say("nothing to restore: give --full and/or --incremental")
        return EXIT_USAGE
    headers: list[bk.Header] = []
    try:
        for path in paths:
            with open(path, "rb") as f:
                parts = bk.scan(f)
            headers.extend(part.header for part in parts)
            if path == full and parts[0].header.kind != "full":
                raise bk.BadBackup(f"{path} is an incremental backup, not a full one")
            if path != full and parts[0].header.kind == "full":
                raise bk.BadBackup(f"{path} is a full backup: give it with --full")
        bk.check_chain(headers, None, follow_restore=False)    # the server checks the rest
        with _client(urls, timeout, security) as client:
            result = client.restore(paths, timeout)
    except DoqError as exc:
        return _failure(exc)
    except OSError as exc:
        _say(f"{exc.filename}: {exc.strerror or exc}")
        return EXIT_FAILED
    print(json.dumps(result), file=out)
    return EXIT_OK


# -- offline reads ---------------------------------------------------------------------------------

def _open_store(cfg: Config) -> lmdb.Environment | None:
    path = os.path.join(cfg.node_dir, "store")
    if not os.path.exists(os.path.join(path, "data.mdb")):
        _say(f"no store at {path}: check --storage.data_dir and --cluster.node_id")
        return None
    return lmdb.open(path, readonly=True, max_dbs=16, lock=False)


def get_queues(cfg: Config, out: IO[str] = sys.stdout) -> int:
    env = _open_store(cfg)
    if env is None:
        return EXIT_FAILED
    try:
        with env.begin() as txn:
            db = env.open_db(b"queues", txn=txn, create=False)
            defs = [decode_queue(key.decode(errors="replace"), value)
                    for key, value in txn.cursor(db=db)]
    finally:
        env.close()
    print(f"\nFound {len(defs)} queues:", file=out)
    for d in sorted(defs, key=lambda d: d.name):
        strategy = d.settings.strategy.name if d.type == QueueType.FAIR else ""
        print(f"{d.name} {d.type.value} {strategy}", file=out)
    return EXIT_OK


def get_messages(cfg: Config, queue: str | None, limit: int, last_id: int, fmt: str,
                 ids: Sequence[str], out: IO[str] = sys.stdout) -> int:
    if not queue:
        print("Queue name is required", file=out)
        return EXIT_USAGE
    if fmt not in FORMATS:
        print(f"Unknown format: {fmt}", file=out)
        return EXIT_USAGE
    try:
        wanted = [int(i) for i in ids]
    except ValueError:
        _say("message ids are numbers")
        return EXIT_USAGE
    env = _open_store(cfg)
    if env is None:
        return EXIT_FAILED
    found: list[dict[str, Any]] = []
    try:
        with env.begin() as txn:
            qdb = env.open_db(b"queues", txn=txn, create=False)
            defs = (decode_queue(k.decode(errors="replace"), v) for k, v in txn.cursor(db=qdb))
            defn = next((d for d in defs if d.name == queue), None)
            if defn is None:
                _say(f"queue {queue!r} not found")
                return EXIT_FAILED
            mdb = env.open_db(b"messages", txn=txn, create=False)
            prefix = U64.pack(defn.qid)
            if wanted:
                pairs = [(mid, txn.get(prefix + U64.pack(mid), db=mdb)) for mid in wanted]
            else:
                cursor = txn.cursor(db=mdb)
                pairs = []
                if cursor.set_range(prefix + U64.pack(last_id + 1)):
                    for key, value in cursor:
                        if not key.startswith(prefix) or len(pairs) >= limit:
                            break
                        pairs.append((U64.unpack(key[8:])[0], value))
            for mid, raw in pairs:
                if raw is None:
                    _say(f"message {mid} not found")
                    continue
                priority, group, content, metadata = decode_message(bytes(raw))
                found.append({"Group": group, "ID": mid, "Priority": priority,
                              "Content": content, "Metadata": metadata})
    finally:
        env.close()
    if fmt == "json":
        print(json.dumps(found, indent=2, ensure_ascii=False), file=out)
    elif fmt == "jsonl":                # the API's names: a line reads like an API message,
        for m in found:                 # its id a string (64-bit ids lose digits as numbers)
            print(json.dumps({"id": str(m["ID"]), "group": m["Group"], "priority": m["Priority"],
                              "content": m["Content"], "metadata": m["Metadata"]},
                             ensure_ascii=False), file=out)
    else:
        for m in found:
            print(f"Message\nID: {m['ID']}\nGroup: {m['Group']}\nPriority: {m['Priority']}\n"
                  f"Content: {m['Content']}\nMetadata: {m['Metadata']}\n", file=out)
    return EXIT_OK


# -- API keys --------------------------------------------------------------------------------------

def _read_keys(path: str) -> list[auth.ApiKey] | None:
    if not os.path.exists(path):
        return []
    try:
        return auth.read_keys_file(path)
    except auth.KeysFileError as exc:
        _say(str(exc))
        return None


def keys_add(path: str, name: str, role: str, queues: Sequence[str],
             out: IO[str] = sys.stdout) -> int:
    """Add a key to the file (created if missing) and print it, once: only its digest is
    stored."""
    if role not in auth.ROLES:
        _say(f"--role must be one of {', '.join(auth.ROLES)}, not {role!r}")
        return EXIT_USAGE
    keys = _read_keys(path)
    if keys is None:
        return EXIT_FAILED
    if any(k.name == name for k in keys):
        _say(f"a key named {name!r} exists already: revoke it first, or pick another name")
        return EXIT_FAILED
    secret = auth.new_key()
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    entry = auth.ApiKey(name, role, auth.hash_key(secret), tuple(queues), created)
    try:
        auth.parse_keys({"keys": [{"name": name, "role": role, "sha256": entry.sha256,
                                   "queues": list(queues)}]}, "--name/--role/--queues")
        auth.write_keys_file(path, keys + [entry])
    except auth.KeysFileError as exc:
        _say(str(exc))
        return EXIT_USAGE
    except OSError as exc:
        _say(f"{path}: {exc.strerror or exc}")
        return EXIT_FAILED
    _say(f"added key {name!r} ({role}{', queues ' + ', '.join(queues) if queues else ''}) "
         f"to {path}; it is shown once, here:")
    print(secret, file=out)
    return EXIT_OK


def keys_list(path: str, out: IO[str] = sys.stdout) -> int:
    keys = _read_keys(path)
    if keys is None:
        return EXIT_FAILED
    if not keys:
        _say(f"no keys in {path}")
        return EXIT_OK
    rows = [("NAME", "ROLE", "QUEUES", "CREATED", "SHA-256")] + [
        (key.name, key.role, ",".join(key.queues) or "*", key.created or "-", key.sha256[:12])
        for key in keys]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4],
              file=out)
    return EXIT_OK


def keys_revoke(path: str, name: str) -> int:
    keys = _read_keys(path)
    if keys is None:
        return EXIT_FAILED
    kept = [k for k in keys if k.name != name]
    if len(kept) == len(keys):
        _say(f"no key named {name!r} in {path}")
        return EXIT_FAILED
    try:
        auth.write_keys_file(path, kept)
    except OSError as exc:
        _say(f"{path}: {exc.strerror or exc}")
        return EXIT_FAILED
    _say(f"revoked key {name!r}; nodes stop accepting it within a second or two")
    return EXIT_OK
