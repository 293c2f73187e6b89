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

from pysyncobj.config import FAIL_REASON
from pysyncobj.monotonic import monotonic
from pysyncobj.transport import TransportNotReadyError

FOLLOWER, CANDIDATE, LEADER = 0, 1, 2
REGULAR = b"\x00"                  # PySyncObj's replicated call: REGULAR | pickle(call)
MERGED = b"\x10"                   # DOQ: MERGED | pickle([REGULAR command, ...])


def _start_election(node: Any, now: float) -> None:
    """A follower or candidate whose election deadline passed (PySyncObj's code)."""
    node._SyncObj__raftElectionDeadline = now + node._SyncObj__generateRaftTimeout()
    node._SyncObj__transferInProgress = False
    node._SyncObj__raftLeader = None
    node._SyncObj__setState(CANDIDATE)
    node._SyncObj__setCurrentTerm(node._SyncObj__raftCurrentTerm + 1,
                                  node._SyncObj__selfNode.id)
    node._SyncObj__votesCount = 1
    for other in node._SyncObj__otherNodes:
        node._SyncObj__transport.send(other, {
            "type": "request_vote",
            "term": node._SyncObj__raftCurrentTerm,
            "last_log_index": node._SyncObj__getCurrentLogIndex(),
            "last_log_term": node._SyncObj__getCurrentLogTerm(),
        })
    node._SyncObj__onLeaderChanged()
    if node._SyncObj__votesCount > (len(node._SyncObj__otherNodes) + 1) / 2:
        node._SyncObj__onBecomeLeader()


def commit_index(node: Any, synced_index: int) -> int:
    """The leader's commit index: the highest index of its current term stored durably on a
    majority, the leader counting only up to its own ``synced_index`` (followers acknowledge
    only synced entries, see ``DurableTransport``)."""
    current = node._SyncObj__raftCommitIndex
    last = node._SyncObj__getCurrentLogIndex()
    others = node._SyncObj__otherNodes
    match = node._SyncObj__raftMatchIndex
    majority = (len(others) + 1) / 2
    term = node._SyncObj__raftCurrentTerm
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
        entries = node._SyncObj__getEntries(index, 1)
        if entries and entries[0][2] == term:
            result = index           # an entry of an earlier term commits only with a newer one
    return result


def _lead(node: Any, now: float) -> None:
    """Leader bookkeeping: advance the commit index; step down without a recent majority."""
    new_commit = node.doq_commit_index(node.doq_journal.synced_index)
    if new_commit != node._SyncObj__raftCommitIndex:
        node._SyncObj__raftCommitIndex = new_commit
        node._SyncObj__raftLog.setRaftCommitIndex(new_commit)
    node._SyncObj__leaderCommitIndex = node._SyncObj__raftCommitIndex
    deadline = now - node._SyncObj__conf.leaderFallbackTimeout
    last_response = node._SyncObj__lastResponseTime
    others = node._SyncObj__otherNodes
    count = 1 + sum(1 for other in others if last_response[other] > deadline)
    if count <= (len(others) + 1) / 2:
        node._SyncObj__setState(FOLLOWER)
        node._SyncObj__raftLeader = None


def _followers_behind(node: Any) -> bool:
    """Whether some follower's nextIndex is at or below the log's last index (new entries,
    or a follower that answered ``reset`` and must be sent older ones)."""
    last = node._SyncObj__getCurrentLogIndex()
    next_index = node._SyncObj__raftNextIndex
    connected = node._SyncObj__connectedNodes
    return any(next_index.get(other, last + 1) <= last
               for other in node._SyncObj__otherNodes if other in connected)


def _subscribe(node: Any, callback: Any, index: int, term: int) -> None:
    """Tell a command's proposer where it went: a local callback waits for the commit of
    ``index``; a follower that forwarded it is told the index (PySyncObj's protocol)."""
    if isinstance(callback, tuple):
        request_node, request_id = callback
        node._SyncObj__transport.send(request_node, {
            "type": "apply_command_response", "request_id": request_id,
            "log_idx": index, "log_term": term})
    elif callback is not None:
        node._SyncObj__commandsWaitingCommit[index].append((term, callback))


def _append_merged(node: Any, pending: list[tuple[bytes, Any]]) -> None:
    """One entry for the calls in ``pending`` (a single call stays as PySyncObj wrote it)."""
    entry = pending[0][0] if len(pending) == 1 else \
        MERGED + pickle.dumps([command for command, _ in pending], protocol=5)
    index = node._SyncObj__getCurrentLogIndex() + 1
    term = node._SyncObj__raftCurrentTerm
    node._SyncObj__raftLog.add(entry, index, term)
    for _, callback in pending:
        _subscribe(node, callback, index, term)


def _append_single(node: Any, command: bytes, callback: Any) -> None:
    """Any other command, as PySyncObj appends it (a membership change may be refused)."""
    change = node._SyncObj__parseChangeClusterRequest(command) \
        if node._SyncObj__conf.dynamicMembershipChange else None
    if change is not None and not node._SyncObj__changeCluster(change):
        if isinstance(callback, tuple):
            node._SyncObj__transport.send(callback[0], {
                "type": "apply_command_response", "request_id": callback[1],
                "error": FAIL_REASON.REQUEST_DENIED})
        elif callback is not None:
            callback(None, FAIL_REASON.REQUEST_DENIED)
        return
    index = node._SyncObj__getCurrentLogIndex() + 1
    term = node._SyncObj__raftCurrentTerm
    node._SyncObj__raftLog.add(command, index, term)
    _subscribe(node, callback, index, term)


def _pipeline_full(node: Any) -> bool:
    """Whether ``raft.pipeline_entries`` replicated calls' entries wait for their commit.
    Any other entry waiting (a membership change, a new leader's no-op) lifts the limit: a
    change that cannot commit must be followed by its undoing (cluster.Membership)."""
    commit = node._SyncObj__raftCommitIndex
    if node._SyncObj__getCurrentLogIndex() - commit < node.doq_pipeline_entries:
        return False
    return all(entry[0][:1] in (REGULAR, MERGED)
               for entry in node._SyncObj__getEntries(commit + 1))


def append_commands(node: Any) -> None:
    """The leader's part of ``_checkCommandsToApply``: every queued command into the log,
    consecutive replicated calls merged into one entry of at most ``max_entry_bytes`` — once
    fewer than ``raft.pipeline_entries`` entries wait for their commit (see the module
    notes)."""
    if _pipeline_full(node):
        return
    commands = node._SyncObj__commandsQueue
    limit = node.doq_max_entry_bytes
    pending: list[tuple[bytes, Any]] = []
    size = 0
    started = monotonic()
    period = node._SyncObj__conf.appendEntriesPeriod
    while monotonic() - started < period:
        try:
            command, callback = commands.get_nowait()
        except queue.Empty:
            break
        if command[:1] == REGULAR:
            if pending and size + len(command) > limit:
                _append_merged(node, pending)
                pending, size = [], 0
            pending.append((command, callback))
            size += len(command)
            continue
        if pending:
            _append_merged(node, pending)
            pending, size = [], 0
        _append_single(node, command, callback)
    if pending:
        _append_merged(node, pending)


def tick(node: Any, time_to_wait: float) -> None:
    """One tick of ``node`` (a :class:`~doq_lib.raft.node.RaftNode`), then poll."""
    transport = node._SyncObj__transport
    if not transport.ready:
        try:
            transport.tryGetReady()
        except TransportNotReadyError:
            pass
    if not transport.ready:
        time.sleep(time_to_wait)
        node._SyncObj__applyLogEntries()
        return
    conf = node._SyncObj__conf
    if node._SyncObj__needLoadDumpFile:
        if conf.fullDumpFile is not None and os.path.isfile(conf.fullDumpFile):
            node._SyncObj__loadDumpFile(clearJournal=False)
        node._SyncObj__needLoadDumpFile = False
    now = monotonic()
    if now - node._SyncObj__startTime > node._SyncObj__numOneSecondDumps:
        node._SyncObj__numOneSecondDumps += 1
        node._SyncObj__raftLog.onOneSecondTimer()
    if node._SyncObj__raftState != LEADER and node._SyncObj__selfNode is not None and \
            node._SyncObj__raftElectionDeadline < now and node._SyncObj__connectedToAnyone():
        _start_election(node, now)
    if node._SyncObj__raftState == LEADER:
        _lead(node, now)
    node._SyncObj__applyLogEntries()
    node._checkCommandsToApply()
    if node._SyncObj__raftState == LEADER:
        commit = node._SyncObj__raftCommitIndex
        if commit != node.doq_sent_commit or now > node._SyncObj__newAppendEntriesTime or \
                _followers_behind(node):
            node.doq_sent_commit = commit
            node._SyncObj__sendAppendEntries()
    if not node._SyncObj__onReadyCalled and \
            node._SyncObj__raftLastApplied == node._SyncObj__leaderCommitIndex:
        if conf.onReady:
            conf.onReady()
        node._SyncObj__onReadyCalled = True
    node._SyncObj__tryLogCompaction()
    with node._SyncObj__onTickCallbacksLock:
        for callback in node._SyncObj__onTickCallbacks:
            callback()
    node._poller.poll(time_to_wait)
