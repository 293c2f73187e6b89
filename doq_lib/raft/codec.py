"""The Raft codec: the restricted unpicklers (plain data in frames; plain data and PySyncObj's
node objects in log commands) and :func:`install`, which routes PySyncObj's unpickling through
them.
"""
from __future__ import annotations

import io
import pickle
from typing import Any

from doq_lib.raft.engine import set_unpickler

PICKLE_PROTOCOL = 5

#: Globals a Raft log command may name: PySyncObj's membership entries and snapshot metadata
#: carry node objects. Frames on the wire may name none at all.
COMMAND_GLOBALS = frozenset({("pysyncobj.node", "TCPNode"), ("pysyncobj.node", "Node")})


class UnsafePayload(pickle.UnpicklingError):
    """A payload tried to build something other than plain data."""


class _Unpickler(pickle.Unpickler):
    allowed: frozenset[tuple[str, str]] = frozenset()

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.allowed:
            return super().find_class(module, name)
        raise UnsafePayload(f"refused to load {module}.{name}: only plain data is accepted")


class _CommandUnpickler(_Unpickler):
    allowed = COMMAND_GLOBALS


def loads_frame(data: bytes) -> Any:
    """Decode a message body: plain data only."""
    return _Unpickler(io.BytesIO(data)).load()


def loads_command(data: Any) -> Any:
    """Decode a Raft command, snapshot header or journal meta: plain data and node objects."""
    if isinstance(data, str):
        data = data.encode("latin-1")
    return _CommandUnpickler(io.BytesIO(data)).load()


def _load_file(f: Any) -> Any:
    return _CommandUnpickler(f).load()


def dumps(message: Any) -> bytes:
    return pickle.dumps(message, PICKLE_PROTOCOL)

_installed = False


def install() -> None:
    """Route every unpickling PySyncObj does through the restricted loaders (idempotent)."""
    global _installed
    if _installed:
        return
    # commands, membership changes and transmissions; PySyncObj's own dump files
    set_unpickler(loads_command, _load_file, PICKLE_PROTOCOL)
    _installed = True
