"""DOQ's Raft tick (L3): PySyncObj's ``SyncObj._onTick``, rewritten for group commit.

PySyncObj's tick (with ``appendEntriesUseBatch=False``, the setting that sends entries without
waiting for the next heartbeat) sends a whole ``append_entries`` round to every follower for
each command it appends and again after each apply, and counts the leader toward every
majority as if its log were on disk. DOQ used to make that true by waiting for the leader's
own fsync before every tick, which stalled the processing of acks and forwarded commands
behind each sync. This tick:

* counts the leader toward the majority of an index only once its journal is synced past it
  (``synced_index``), so the leader's fsync runs alongside the followers' round trip and
  nothing waits for it; its completion wakes the tick (``RaftNode._synced``);
* appends every command that arrived since the last tick, then sends **one**
  ``append_entries`` per follower carrying all of them (and the commit index); it also sends
  when the commit index moved (followers apply and answer forwarded writes without waiting
  for a heartbeat), when a follower's ``nextIndex`` was moved back, and at each heartbeat;
* otherwise does what PySyncObj's tick does, in the same order: transport readiness, the
  snapshot loaded at start, the one-second timer, elections, leader fallback, apply,
  ``onReady``, log compaction, tick callbacks, then the poll.

The node runs PySyncObj with ``appendEntriesUseBatch=True`` so that none of its own code
paths sends per command; this tick decides every send.

**Merged entries.** On the leader, the replicated calls that arrived since the last tick
(its own committer's batches and those the followers forwarded) become **one** log entry,
``MERGED | pickle([command, ...])`` (:func:`append_commands`), up to ``max_entry_bytes`` (a
lone call stays the ``REGULAR`` entry PySyncObj would have written);
any other command (a membership change, PySyncObj's own) is appended on its own, in order.
Most of a Raft entry's cost does not depend on its size (journal record, messages, acks, the
commit, one state machine transaction on every node), so the cluster pays it once for every
node's batches instead of once per batch. Each proposer is told the entry's index as before
and finds its own results in it by batch id (:class:`~doq_lib.raft.pipeline.EntryResult`).

**How many entries at once.** The leader appends only while fewer than
``raft.pipeline_entries`` (default 1) of its entries wait for their commit; calls arriving
meanwhile wait in the queue and all go into the next entry when the commit comes (the tick
runs on every acknowledgement). Under load this makes fewer, larger entries: with 32 clients
each waiting for its answer, about 40 % fewer entries per message and 5-20 % more messages
per second (docs/BENCHMARKS.md). Only replicated calls' entries count: while a
membership change or a new leader's no-op (PySyncObj's own) waits, the leader appends as
before, so an addition that cannot commit is followed by its undoing, and entries of an
earlier term commit with the no-op.
"""
from __future__ import annotations

import os
import pickle
import queue
import time
from typing import Any

from doq_lib.raft.engine import (
    CANDIDATE,
    FAIL_REASON,
    FOLLOWER,
    LEADER,
    RaftState,
    TransportNotReadyError,
    monotonic,
)

REGULAR = b"\x00"                  # PySyncObj's replicated call: REGULAR | pickle(call)
MERGED = b"\x10"                   # DOQ: MERGED | pickle([REGULAR command, ...])


def _start_election(raft: RaftState, now: float) -> None:
    """A follower or candidate whose election deadline passed (PySyncObj's code)."""
    raft.election_deadline = now + raft.random_election_timeout()
    raft.transfer_in_progress = False
    raft.leader = None
    raft.set_state(CANDIDATE)
    raft.set_current_term(raft.current_term + 1, raft.self_node.id)
    raft.votes_count = 1
    for other in raft.other_nodes:
        raft.transport.send(other, {
            "type": "request_vote",
            "term": raft.current_term,
            "last_log_index": raft.last_log_index(),
            "last_log_term": raft.last_log_term(),
        })
    raft.leader_changed()
    if raft.votes_count > (len(raft.other_nodes) + 1) / 2:
        raft.become_leader()


def commit_index(raft: RaftState, synced_index: int) -> int:
    """The leader's commit index: the highest index of its current term stored durably on a
    majority, the leader counting only up to its own ``synced_index`` (followers acknowledge
    only synced entries, see ``DurableTransport``)."""
    current = raft.commit_index
    last = raft.last_log_index()
    others = raft.other_nodes
    match = raft.match_index
    majority = (len(others) + 1) / 2
    term = raft.current_term
    result = current
    index = current
    while index < last:
        index += 1
        count = 1 if index <= synced_index else 0
        for other in others:
            if match[other] >= index:
                count += 1
        if count <= majority:
            break
        entries = raft.entries(index, 1)
        if entries and entries[0][2] == term:
            result = index           # an entry of an earlier term commits only with a newer one
    return result


def _lead(node: Any, now: float) -> None:
    """Leader bookkeeping: advance the commit index; step down without a recent majority."""
    raft = node.raft
    new_commit = node.doq_commit_index(node.doq_journal.synced_index)
    if new_commit != raft.commit_index:
        raft.commit_index = new_commit
        raft.log.setRaftCommitIndex(new_commit)
    if raft.leader_commit_index != new_commit:     # (a write costs a call: only on change)
        raft.leader_commit_index = new_commit
    deadline = now - raft.conf.leaderFallbackTimeout
    last_response = raft.last_response_time
    others = raft.other_nodes
    count = 1 + sum(1 for other in others if last_response[other] > deadline)
    if count <= (len(others) + 1) / 2:
        raft.set_state(FOLLOWER)
        raft.leader = None


def _followers_behind(raft: RaftState) -> bool:
    """Whether some follower's nextIndex is at or below the log's last index (new entries,
    or a follower that answered ``reset`` and must be sent older ones)."""
    last = raft.last_log_index()
    next_index = raft.next_index
    connected = raft.connected_nodes
    return any(next_index.get(other, last + 1) <= last
               for other in raft.other_nodes if other in connected)


def _subscribe(raft: RaftState, callback: Any, index: int, term: int) -> None:
    """Tell a command's proposer where it went: a local callback waits for the commit of
    ``index``; a follower that forwarded it is told the index (PySyncObj's protocol)."""
    if isinstance(callback, tuple):
        request_node, request_id = callback
        raft.transport.send(request_node, {
            "type": "apply_command_response", "request_id": request_id,
            "log_idx": index, "log_term": term})
    elif callback is not None:
        raft.waiting_commit[index].append((term, callback))


def _append_merged(raft: RaftState, pending: list[tuple[bytes, Any]]) -> None:
    """One entry for the calls in ``pending`` (a single call stays as PySyncObj wrote it)."""
    entry = pending[0][0] if len(pending) == 1 else \
        MERGED + pickle.dumps([command for command, _ in pending], protocol=5)
    index = raft.last_log_index() + 1
    term = raft.current_term
    raft.log.add(entry, index, term)
    for _, callback in pending:
        _subscribe(raft, callback, index, term)


def _append_single(raft: RaftState, command: bytes, callback: Any) -> None:
    """Any other command, as PySyncObj appends it (a membership change may be refused)."""
    change = raft.parse_change(command) if raft.conf.dynamicMembershipChange else None
    if change is not None and not raft.change_cluster(change):
        if isinstance(callback, tuple):
            raft.transport.send(callback[0], {
                "type": "apply_command_response", "request_id": callback[1],
                "error": FAIL_REASON.REQUEST_DENIED})
        elif callback is not None:
            callback(None, FAIL_REASON.REQUEST_DENIED)
        return
    index = raft.last_log_index() + 1
    term = raft.current_term
    raft.log.add(command, index, term)
    _subscribe(raft, callback, index, term)


def _pipeline_full(raft: RaftState, limit: int) -> bool:
    """Whether ``limit`` (``raft.pipeline_entries``) replicated calls' entries wait for their
    commit. Any other entry waiting (a membership change, a new leader's no-op) lifts the
    limit: a change that cannot commit must be followed by its undoing (cluster.Membership)."""
    commit = raft.commit_index
    if raft.last_log_index() - commit < limit:
        return False
    return all(entry[0][:1] in (REGULAR, MERGED) for entry in raft.entries(commit + 1))


def append_commands(node: Any) -> None:
    """The leader's part of ``take_commands``: every queued command into the log,
    consecutive replicated calls merged into one entry of at most ``max_entry_bytes`` — once
    fewer than ``raft.pipeline_entries`` entries wait for their commit (see the module
    notes)."""
    raft = node.raft
    if _pipeline_full(raft, node.doq_pipeline_entries):
        return
    commands = raft.commands_queue
    limit = node.doq_max_entry_bytes
    pending: list[tuple[bytes, Any]] = []
    size = 0
    started = monotonic()
    period = raft.conf.appendEntriesPeriod
    while monotonic() - started < period:
        try:
            command, callback = commands.get_nowait()
        except queue.Empty:
            break
        if command[:1] == REGULAR:
            if pending and size + len(command) > limit:
                _append_merged(raft, pending)
                pending, size = [], 0
            pending.append((command, callback))
            size += len(command)
            continue
        if pending:
            _append_merged(raft, pending)
            pending, size = [], 0
        _append_single(raft, command, callback)
    if pending:
        _append_merged(raft, pending)


def tick(node: Any, time_to_wait: float) -> None:
    """One tick of ``node`` (a :class:`~doq_lib.raft.node.RaftNode`), then poll."""
    raft = node.raft
    transport = raft.transport
    if not transport.ready:
        try:
            transport.tryGetReady()
        except TransportNotReadyError:
            pass
    if not transport.ready:
        time.sleep(time_to_wait)
        raft.apply_log_entries()
        return
    conf = raft.conf
    if raft.need_load_dump_file:
        if conf.fullDumpFile is not None and os.path.isfile(conf.fullDumpFile):
            raft.load_dump_file(clearJournal=False)
        raft.need_load_dump_file = False
    now = monotonic()
    if now - raft.start_time > raft.one_second_timers:
        raft.one_second_timers += 1
        raft.log.onOneSecondTimer()
    if raft.state != LEADER and raft.self_node is not None and \
            raft.election_deadline < now and raft.connected_to_anyone():
        _start_election(raft, now)
    if raft.state == LEADER:
        _lead(node, now)
    raft.apply_log_entries()
    node.take_commands()
    if raft.state == LEADER:
        commit = raft.commit_index
        if commit != node.doq_sent_commit or now > raft.next_heartbeat or \
                _followers_behind(raft):
            node.doq_sent_commit = commit
            raft.send_append_entries()
    if not raft.on_ready_called and raft.last_applied == raft.leader_commit_index:
        if conf.onReady:
            conf.onReady()
        raft.on_ready_called = True
    raft.try_log_compaction()
    with raft.tick_callbacks_lock:
        for callback in raft.tick_callbacks:
            callback()
    raft.poller.poll(time_to_wait)
