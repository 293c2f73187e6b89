"""The deterministic state machine (L3).

``apply_entries`` applies committed Raft entries, each ``(index, ops, now_ms)``, to LMDB and to
the in-memory indexes. Rules that keep every replica identical:

* the only time is the command's ``now_ms`` (never run backwards: the largest seen is kept);
* ids, delivery choices and redelivery are computed here from state + command, never randomly;
* every entry's effects and its Raft index are written in the same LMDB transaction, and an
  entry whose index is not above the stored one is skipped (journal replay is idempotent);
* nothing raises out of here: each operation gets a ``(ResultCode, value)``. An operation that
  hits a bug is rolled back alone (nested transaction + reload of the in-memory state) and
  answered ``INTERNAL``; the others of its entry still apply.

The package, by domain: ``state`` (in-memory state and shared types), ``queues``,
``messages``, ``membership``, ``restore`` (the operations), ``machine`` (applying entries,
loading, the read API).
"""
from doq_lib.fsm.machine import StateMachine
from doq_lib.fsm.state import (
    FAULT_CONTENT,
    MISSING,
    Entry,
    InjectedFault,
    Missing,
    QueueCounters,
    QueueState,
    Result,
    Unacked,
    new_index,
)

__all__ = ["FAULT_CONTENT", "MISSING", "Entry", "InjectedFault", "Missing", "QueueCounters",
           "QueueState", "Result", "StateMachine", "Unacked", "new_index"]
