"""Logging set-up (L0). The only module that installs handlers."""
from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")

_LEVELS = {
    "trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
    "warn": logging.WARNING, "warning": logging.WARNING, "error": logging.ERROR,
    "fatal": logging.CRITICAL, "panic": logging.CRITICAL,
}
_SEVERITY = {
    logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARNING",
    logging.ERROR: "ERROR", logging.CRITICAL: "CRITICAL",
}


class StackdriverFormatter(logging.Formatter):
    """One JSON object per line with ``severity`` and ``time`` (SPEC §9 logging.mode)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "severity": _SEVERITY.get(record.levelno, "DEFAULT"),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(mode: str = "console", level: str = "warning") -> None:
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler: logging.Handler
    if mode == "stackdriver":
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(StackdriverFormatter())
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(_LEVELS.get(level.lower(), logging.WARNING))
    # PySyncObj logs every connection attempt to a down peer at WARNING.
    logging.getLogger("pysyncobj").setLevel(max(root.level, logging.ERROR))


def apply_quietly(pool: Any, fn: Callable[..., T], *args: Any) -> T:
    """``pool.apply(fn, args)`` (a gevent thread pool) that raises what ``fn`` raised in the
    caller, without gevent printing a traceback for it first: a refused backup, a browse of
    a message that left, are answers, not crashes."""
    def run() -> tuple[bool, Any]:
        try:
            return True, fn(*args)
        except Exception as exc:  # noqa: BLE001 - handed to the caller as it is
            return False, exc
    ok, value = pool.apply(run)
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


class RateLimited:
    """At most ``burst`` lines per ``period`` seconds for one kind of event (refused TLS
    handshakes, say), then one line saying how many more were left out: a flood of bad
    connections cannot fill the log. Thread-safe."""

    def __init__(self, logger: logging.Logger, burst: int = 10, period: float = 60.0) -> None:
        self.logger, self.burst, self.period = logger, burst, period
        self._lock = threading.Lock()
        self._start = 0.0
        self._count = 0
        self._dropped = 0

    def log(self, level: int, message: str, *args: Any) -> bool:
        """Log it unless this period's lines are used up; whether it was logged."""
        now = time.monotonic()
        with self._lock:
            dropped = 0
            if now - self._start >= self.period:
                dropped, self._dropped = self._dropped, 0
                self._start, self._count = now, 0
            self._count += 1
            allowed = self._count <= self.burst
            if not allowed:
                self._dropped += 1
        if dropped:
            self.logger.log(level, "%d more like the next line were not logged in the last "
                            "%g s", dropped, self.period)
        if allowed:
            self.logger.log(level, message, *args)
        return allowed


def handshake_or_refuse(handshake: Callable[[], T], client_socket: Any, address: Any,
                        refused: RateLimited, what: str) -> T | None:
    """Run a server's TLS handshake (``handshake``); a client whose handshake fails (no or a
    wrong certificate, plain text, a timeout, a reset) is logged in one line through
    ``refused`` — not with gevent's traceback for every such connection — and closed."""
    try:
        return handshake()
    except OSError as exc:              # ssl.SSLError, a timeout, a reset, ... one line
        refused.log(logging.INFO, "%s with %s failed: %s", what,
                    address[0] if address else "?",
                    getattr(exc, "reason", None) or exc or type(exc).__name__)
        try:
            client_socket.close()
        except OSError:
            pass
        return None
