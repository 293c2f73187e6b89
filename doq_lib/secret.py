"""The cluster secret (L0): one passphrase every member knows, and the keys derived from it.

Nothing uses the passphrase itself. It is stretched once (PBKDF2-HMAC-SHA256) into a master
key, and every use gets its own key derived from that one with a label (``raft`` for the
Raft wire, ``backup`` for backup signatures, ``node-http`` for requests between nodes), so a
key that leaks from one use says nothing about the others.

The passphrase comes from ``raft.password`` (flag, environment ``DOQ_RAFT_PASSWORD``, config
file) or from the file named by ``raft.password_file`` (its first line), which is how Docker
and Kubernetes secrets are usually mounted.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import time

MIN_LENGTH = 16                      # characters; a captured handshake allows offline guessing
_SALT = b"doq cluster secret v1"
_ROUNDS = 120_000
_cache: dict[str, bytes] = {}        # passphrase -> master key (stretching costs ~0.1 s)


class SecretError(ValueError):
    """The cluster secret cannot be read or is unusable."""


class ClusterSecret:
    """The keys derived from a cluster passphrase."""

    def __init__(self, passphrase: str) -> None:
        if len(passphrase) < MIN_LENGTH:
            raise SecretError(f"the cluster secret must have at least {MIN_LENGTH} characters "
                              f"(for example the output of 'openssl rand -hex 32')")
        master = _cache.get(passphrase)
        if master is None:
            master = hashlib.pbkdf2_hmac("sha256", passphrase.encode(), _SALT, _ROUNDS)
            _cache[passphrase] = master
        self._master = master

    def key(self, purpose: str) -> bytes:
        """A 32-byte key for one purpose (``raft``, ``backup``, ``node-http`` ...)."""
        return hmac.new(self._master, b"doq/" + purpose.encode(), hashlib.sha256).digest()

    # -- requests between nodes (HTTP) -------------------------------------------------------
    def sign_request(self, method: str, target: str, body: bytes,
                     now: float | None = None) -> str:
        """The value of the node signature header for one request (see :meth:`verify`)."""
        stamp = int(time.time() if now is None else now)
        return f"v1 {stamp} {self._request_mac(stamp, method, target, body)}"

    def verify_request(self, header: str, method: str, target: str, body: bytes,
                       window: float = 60.0, now: float | None = None) -> bool:
        """Whether ``header`` signs this request and was made within ``window`` seconds."""
        parts = header.split(" ")
        if len(parts) != 3 or parts[0] != "v1" or not parts[1].isdigit():
            return False
        stamp = int(parts[1])
        current = time.time() if now is None else now
        if abs(current - stamp) > window:
            return False
        expected = self._request_mac(stamp, method, target, body)
        return hmac.compare_digest(expected, parts[2])

    def _request_mac(self, stamp: int, method: str, target: str, body: bytes) -> str:
        message = b"\n".join([str(stamp).encode(), method.upper().encode(),
                              target.encode("utf-8", "surrogateescape"),
                              hashlib.sha256(body).hexdigest().encode()])
        return hmac.new(self.key("node-http"), message, hashlib.sha256).hexdigest()


def read_passphrase(password: str, password_file: str) -> str:
    """The passphrase from the setting or the first line of the file ("" when neither)."""
    if password:
        return password
    if not password_file:
        return ""
    try:
        with open(password_file, encoding="utf-8") as f:
            line = f.readline().strip()
    except OSError as exc:
        raise SecretError(f"cannot read raft.password_file {password_file!r}: "
                          f"{exc.strerror}") from None
    except UnicodeDecodeError:
        raise SecretError(f"raft.password_file {password_file!r} is not UTF-8 text") from None
    if not line:
        raise SecretError(f"raft.password_file {password_file!r} is empty")
    return line


def load_secret(password: str, password_file: str) -> ClusterSecret | None:
    """The cluster secret configured, or None when there is none."""
    passphrase = read_passphrase(password, password_file)
    return ClusterSecret(passphrase) if passphrase else None


def is_loopback_host(host: str) -> bool:
    """Whether binding ``host`` exposes the port only to this machine.

    Empty (every interface) and names other than ``localhost`` count as exposed: a name may
    resolve to anything.
    """
    host = host.strip("[]")
    if host.lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
