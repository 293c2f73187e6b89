"""Faster, wire-compatible encoding for PySyncObj messages (DESIGN.md §2.6).

PySyncObj pickles every message with protocol 2 (bytes become latin-1 strings, several times
slower and ~1.5x bigger) and zlib-compresses it at level 3 once per follower. Receivers only
call ``pickle.loads`` and ``zlib.decompress``, which read any protocol and any level, so raising
the protocol to 5 and storing (level 0) changes nothing on the wire contract.
"""
from __future__ import annotations

import types
import zlib

import pysyncobj.pickle as _ps_pickle
import pysyncobj.tcp_connection as _ps_tcp

PICKLE_PROTOCOL = 5
ZLIB_LEVEL = 0
_installed = False


def install() -> None:
    """Idempotent; must run before any SyncObj is created."""
    global _installed
    if _installed:
        return
    # `dumps`/`dump` read this module global at call time.
    vars(_ps_pickle)["__protocol"] = PICKLE_PROTOCOL
    _ps_tcp.zlib = types.SimpleNamespace(  # type: ignore[attr-defined]
        compress=lambda data, _level=3: zlib.compress(data, ZLIB_LEVEL),
        decompress=zlib.decompress,
        error=zlib.error,
    )
    _installed = True
