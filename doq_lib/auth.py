"""API keys and what each role may do (L0).

A keys file (``auth.keys_file``, YAML) lists keys by the SHA-256 of the key, never the key
itself::

    keys:
      - name: ingest
        role: producer            # admin | producer | consumer | reader
        sha256: 9f86d0...          # hex digest of the key
        queues: ["orders.*"]       # optional: only queues matching one of these patterns
        created: "2026-12-01T10:00:00Z"

Roles: a **reader** lists queues and reads them (queue info, a message by id, the cluster's
servers, metrics); a **producer** also enqueues (and generates ids); a **consumer** also
dequeues, acks, nacks, touches, re-prioritises and deletes messages; an **admin** may do
everything, including creating, changing and deleting queues, backups, restores, joining and
removing nodes and ``/internal/*``. Queue patterns (``fnmatch``: ``*``, ``?``, ``[...]``)
limit a key to those queues; a limited key cannot use cluster-wide operations (backups,
restores, membership, diagnostics, metrics) and sees only its queues in listings.

:class:`KeyStore` re-reads the file when it changes (checked at most once a second), so keys
are added and revoked without a restart; a file that became invalid is reported and the
previous keys stay in force. ``doq keys`` (doq_lib.admin) writes the file.
"""
from __future__ import annotations

import base64
import enum
import fnmatch
import hashlib
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

log = logging.getLogger(__name__)

KEY_PREFIX = "doq_"
ROLES = ("reader", "producer", "consumer", "admin")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_HEX_RE = re.compile(r"[0-9a-f]{64}")
RELOAD_EVERY = 1.0                   # seconds between checks of the keys file


class Permission(str, enum.Enum):
    READ = "read"
    PRODUCE = "produce"
    CONSUME = "consume"
    ADMIN = "admin"


ROLE_PERMISSIONS: dict[str, frozenset[Permission]] = {
    "reader": frozenset({Permission.READ}),
    "producer": frozenset({Permission.READ, Permission.PRODUCE}),
    "consumer": frozenset({Permission.READ, Permission.CONSUME}),
    "admin": frozenset(Permission),
}


class Scope(str, enum.Enum):
    QUEUE = "queue"        # one queue, named by the request
    ANY = "any"            # no queue in particular (listings, ids): filtered by patterns
    CLUSTER = "cluster"    # the whole cluster: keys limited to some queues may not


@dataclass(frozen=True)
class Rule:
    """What a route or RPC needs. ``loopback``: without a keys file, only loopback clients
    (or other nodes, proving the cluster secret) may call it."""

    permission: Permission
    scope: Scope
    loopback: bool = False

    def describe(self) -> str:
        what = {Permission.READ: "read", Permission.PRODUCE: "enqueue",
                Permission.CONSUME: "consume", Permission.ADMIN: "administer"}[self.permission]
        return what + (" the cluster" if self.scope == Scope.CLUSTER else "")


@dataclass(frozen=True)
class ApiKey:
    """One entry of the keys file (or a built-in principal)."""

    name: str
    role: str
    sha256: str = ""
    queues: tuple[str, ...] = ()
    created: str = ""

    def may(self, permission: Permission) -> bool:
        return permission in ROLE_PERMISSIONS[self.role]

    def covers(self, queue: str) -> bool:
        """Whether this key may touch ``queue`` (no patterns: every queue)."""
        return not self.queues or any(fnmatch.fnmatchcase(queue, p) for p in self.queues)

    def problem(self, rule: Rule, queue: str | None = None) -> str | None:
        """Why this key may not do what ``rule`` guards (None: it may)."""
        if not self.may(rule.permission):
            allowed = "admin" if rule.permission == Permission.ADMIN else \
                " or ".join(r for r in ROLES if rule.permission in ROLE_PERMISSIONS[r])
            return (f"key {self.name!r} has role {self.role}, which may not {rule.describe()}"
                    f" (needs {allowed})")
        if rule.scope == Scope.CLUSTER and self.queues:
            return (f"key {self.name!r} is limited to queues {', '.join(self.queues)} and may "
                    f"not {rule.describe()}")
        if rule.scope == Scope.QUEUE and queue is not None and not self.covers(queue):
            return (f"key {self.name!r} may not use queue {queue[:200]!r} (it is limited to "
                    f"{', '.join(self.queues)})")
        return None


DEAD_FROM = "x-dead-from"


def shown_metadata(metadata: dict[str, str],
                   covers: Callable[[str], bool] | None) -> dict[str, str]:
    """A message's metadata as a caller may see it: ``covers`` (the caller's key's
    ``covers``, None when it is not limited to queue patterns) decides whether the origin a
    dead letter names (``x-dead-from``) is shown; a queue outside the key's patterns is
    left out, never named."""
    origin = metadata.get(DEAD_FROM)
    if origin is None or covers is None or covers(origin):
        return metadata
    return {k: v for k, v in metadata.items() if k != DEAD_FROM}


#: A request signed with the cluster secret by another node.
NODE = ApiKey("cluster node", "admin")
#: Every caller when no keys file is configured.
ANONYMOUS = ApiKey("anonymous", "admin")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh API key: ``doq_`` and 256 random bits."""
    raw = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    return KEY_PREFIX + raw


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None: absent or another
    scheme)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


# -- the file ----------------------------------------------------------------------------------
class KeysFileError(ValueError):
    """The keys file cannot be used; the message names every problem."""


def parse_keys(document: Any, where: str = "keys file") -> list[ApiKey]:
    """The keys of a parsed YAML document; KeysFileError listing every problem."""
    if document is None:
        document = {"keys": []}
    if not isinstance(document, dict) or not isinstance(document.get("keys", []), list):
        raise KeysFileError(f"{where}: expected a mapping with a list 'keys'")
    problems: list[str] = []
    keys: list[ApiKey] = []
    seen_names: set[str] = set()
    seen_hashes: set[str] = set()
    for n, entry in enumerate(document.get("keys") or []):
        at = f"{where}: keys[{n}]"
        if not isinstance(entry, dict):
            problems.append(f"{at}: expected a mapping")
            continue
        unknown = set(entry) - {"name", "role", "sha256", "queues", "created"}
        if unknown:
            problems.append(f"{at}: unknown fields {', '.join(sorted(map(str, unknown)))}")
        name, role = str(entry.get("name", "")), entry.get("role")
        digest = str(entry.get("sha256", "")).lower()
        queues = entry.get("queues") or []
        if not _NAME_RE.fullmatch(name):
            problems.append(f"{at}: name must be 1-64 letters, digits or ._@- ({name!r})")
        elif name in seen_names:
            problems.append(f"{at}: name {name!r} is used twice")
        if role not in ROLES:
            problems.append(f"{at}: role must be one of {', '.join(ROLES)} ({role!r})")
        if not _HEX_RE.fullmatch(digest):
            problems.append(f"{at}: sha256 must be 64 hexadecimal digits")
        elif digest in seen_hashes:
            problems.append(f"{at}: the same key is listed twice")
        if not isinstance(queues, list) or not all(isinstance(q, str) and q for q in queues):
            problems.append(f"{at}: queues must be a list of patterns")
            queues = []
        seen_names.add(name)
        seen_hashes.add(digest)
        keys.append(ApiKey(name, str(role), digest, tuple(queues), str(entry.get("created", ""))))
    if problems:
        raise KeysFileError("\n".join(problems))
    return keys


def read_keys_file(path: str) -> list[ApiKey]:
    try:
        with open(path, encoding="utf-8") as f:
            document = yaml.safe_load(f)
    except OSError as exc:
        raise KeysFileError(f"cannot read keys file {path}: {exc.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise KeysFileError(f"keys file {path} is not valid YAML: {exc}") from None
    return parse_keys(document, path)


def write_keys_file(path: str, keys: list[ApiKey]) -> None:
    """Replace the file atomically, readable by its owner only."""
    entries = []
    for key in keys:
        entry: dict[str, Any] = {"name": key.name, "role": key.role, "sha256": key.sha256}
        if key.queues:
            entry["queues"] = list(key.queues)
        if key.created:
            entry["created"] = key.created
        entries.append(entry)
    text = ("# DOQ API keys (doq keys add|list|revoke). Only SHA-256 digests are stored; a key\n"
            "# is shown once, when it is added. Changes apply without a restart.\n"
            + yaml.safe_dump({"keys": entries}, sort_keys=False))
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@dataclass
class KeyStore:
    """The keys of a file, kept current: :meth:`authenticate` notices changes to the file."""

    path: str
    _by_hash: dict[str, ApiKey] = field(default_factory=dict)
    _stamp: tuple[int, int, int] | None = None
    _checked: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def open(cls, path: str) -> "KeyStore":
        """Load ``path`` (KeysFileError if it is unusable: a node does not start then)."""
        store = cls(path)
        store._load(read_keys_file(path), store._file_stamp())
        return store

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _load(self, keys: list[ApiKey], stamp: tuple[int, int, int] | None) -> None:
        self._by_hash = {key.sha256: key for key in keys}
        self._stamp = stamp

    def refresh(self, now: float | None = None) -> None:
        """Re-read the file if it changed since it was last read (at most once a second)."""
        now = time.monotonic() if now is None else now
        if now - self._checked < RELOAD_EVERY:
            return
        with self._lock:
            self._checked = now
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return
            try:
                keys = read_keys_file(self.path)
            except KeysFileError as exc:
                log.error("keys file changed but cannot be used; the previous keys stay in "
                          "force: %s", exc)
                self._stamp = stamp
                return
            self._load(keys, stamp)
            log.warning("keys file reloaded: %d keys", len(keys))

    def authenticate(self, token: str | None) -> ApiKey | None:
        """The key ``token`` is, or None."""
        if not token:
            return None
        self.refresh()
        return self._by_hash.get(hash_key(token))

    def __len__(self) -> int:
        return len(self._by_hash)
