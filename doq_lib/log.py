"""Logging set-up (L0). The only module that installs handlers."""
from __future__ import annotations

import json
import logging
import sys
import time

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
