"""The message lifecycle in the state machine: delivery counts, dead letters,
reject, redrive, and the lifecycle settings' rules."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from tests.core.test_fsm import RR, T0, Node, create, dequeue, enqueue, nack, requeue, update


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node")
    n.run(create("dlq"), create("work", "fair", RR, 0, 10,
                                {"max_deliveries": 2, "dead_letter_queue": "dlq"}))
    yield n
    n.close()


def dead_of(node: Node, mid: int) -> dict[str, str]:
    value = node.ok((C.GET, "dlq", mid))
    meta = dict(value[4])
    assert int(meta.pop("x-dead-at")) == node.now_ms
    return meta


def test_counts_survive_a_restart_and_the_last_delivery_dead_letters(node: Node) -> None:
    mid = node.ok(enqueue("work", "job", 5, "g", metadata={"k": "v"}))[0]
    assert node.ok(dequeue("work"))[5:] == (1, "", 0, node.now_ms)     # made now: its token's
    assert node.ok(nack("work", mid, 0, None, "first")) == (5, None, False, "")
    node.restart()                                             # counts are stored
    assert node.ok((C.GET, "work", mid))[5:] == (1, "first", 0, None)
    assert node.ok(dequeue("work"))[5:] == (2, "first", 0, node.now_ms)
    assert node.ok(nack("work", mid, 0, None)) == (5, None, True, "")   # the error stays
    assert "work" in node.sm.queues and node.sm.queues["work"].index.ready == 0
    assert dead_of(node, mid) == {"k": "v", "x-dead-reason": "max_deliveries",
                                  "x-dead-from": "work", "x-deliveries": "2",
                                  "x-last-error": "first"}
    assert node.ok((C.GET, "dlq", mid))[2] == 0                  # priority 0 in a delayed DLQ
    assert node.sm.queues["work"].attempts == {}
    assert node.sm.queues["work"].stats.dead_lettered == {"max_deliveries": 1}


def test_an_ack_timeout_counts_as_a_delivery(node: Node) -> None:
    mid = node.ok(enqueue("work", "slow", 1, "g"))[0]
    node.ok(dequeue("work"))
    assert node.ok(requeue(), now_ms=T0 + 10_000) == 1
    assert node.ok(dequeue("work"), now_ms=T0 + 10_000).deliveries == 2
    assert node.ok(requeue(), now_ms=T0 + 20_000) == 1         # spent: dead-lettered
    assert node.sm.queues["work"].stats.redelivered == 1
    meta = node.ok((C.GET, "dlq", mid))[4]
    assert (meta["x-dead-reason"], meta["x-deliveries"]) == ("max_deliveries", "2")
    assert "x-last-error" not in meta


def test_without_a_dead_letter_queue_it_is_dropped_and_counted(node: Node) -> None:
    node.ok(update("work", 0, 0, 0, {"dead_letter_queue": ""}))
    mid = node.ok(enqueue("work", "x", 1, "g"))[0]
    node.ok(dequeue("work"))
    node.ok(C.reject("work", mid, "bad"))
    assert node.do((C.GET, "work", mid))[0] == ResultCode.MESSAGE_NOT_FOUND
    assert node.sm.queues["dlq"].index.ready == 0
    assert node.sm.queues["work"].stats.dead_lettered == {"rejected": 1}


def test_reject_needs_a_delivered_message(node: Node) -> None:
    mid = node.ok(enqueue("work", "x", 1, "g"))[0]
    assert node.do(C.reject("work", mid, ""))[0] == ResultCode.NOT_UNACKED
    assert node.do(C.reject("nope", mid, ""))[0] == ResultCode.QUEUE_NOT_FOUND
    node.ok(dequeue("work"))
    node.ok(C.reject("work", mid, ""))
    assert dead_of(node, mid)["x-dead-reason"] == "rejected"


def test_a_taken_id_in_the_dlq_gets_a_new_one(node: Node) -> None:
    node.ok(enqueue("dlq", "already here", 1, mid=77))
    node.ok(enqueue("work", "x", 1, "g", mid=77))
    node.ok(dequeue("work"))
    node.ok(C.reject("work", 77, ""))
    contents = {node.ok((C.GET, "dlq", mid))[3] for mid in node.sm.queues["dlq"].index
                .ordered_ids()}  # type: ignore[attr-defined]
    assert contents == {"already here", "x"}


def spend(node: Node, content: str, group: str = "g") -> int:
    mid = node.ok(enqueue("work", content, 3, group, metadata={"keep": "me"}))[0]
    node.ok(dequeue("work"))
    node.ok(C.reject("work", mid, "why"))
    return int(mid)


def test_redrive_by_default_target_to_ids_and_count(node: Node) -> None:
    node.ok(create("other", "fair"))
    a, b, c, d = (spend(node, f"m{i}") for i in range(4))
    # by ids: back to x-dead-from, without the x-dead-* keys, deliveries reset, same id
    assert node.ok(C.redrive("dlq", "", [a, 999], 10)) == (1, [
        (999, ResultCode.MESSAGE_NOT_FOUND, "no message 999 in queue 'dlq'")])
    back = node.ok((C.GET, "work", a))
    assert back[1:7] == ("default", 0, "m0", {"keep": "me"}, 0, "")  # delayed DLQ: no group
    # by count, to another queue, in id order
    assert node.ok(C.redrive("dlq", "other", None, 2)) == (2, [])
    assert {node.ok((C.GET, "other", m))[3] for m in (b, c)} == {"m1", "m2"}
    # the rest, by default
    assert node.ok(C.redrive("dlq", "", None, 100)) == (1, [])
    assert node.ok((C.GET, "work", d))[3] == "m3"
    assert node.sm.queues["dlq"].index.ready == 0


def test_redrive_refusals_leave_each_message_where_it_is(node: Node) -> None:
    plain = node.ok(enqueue("dlq", "never dead", 0))[0]      # ahead of the dead letters
    taken = spend(node, "taken")
    node.ok(dequeue("dlq"))                         # the oldest: plain, now delivered
    gone = spend(node, "orphan")
    node.run(create("tmp", "fair", RR, 0, 10, {"dead_letter_queue": "dlq"}))
    mid = node.ok(enqueue("tmp", "from tmp", 1, "g"))[0]
    node.ok(dequeue("tmp"))
    node.ok(C.reject("tmp", mid, ""))
    node.ok(update("tmp", 0, 0, 0, {"dead_letter_queue": ""}))
    node.ok((C.DELETE_QUEUE, "tmp"))
    moved, failed = node.ok(C.redrive("dlq", "", [plain, taken, mid, 12345], 10))
    codes = {m: code for m, code, _ in failed}
    assert moved == 1 and codes == {plain: ResultCode.MESSAGE_DELIVERED,
                                    mid: ResultCode.QUEUE_NOT_FOUND,
                                    12345: ResultCode.MESSAGE_NOT_FOUND}
    assert node.do((C.GET, "work", taken))[0] == ResultCode.OK
    node.ok((C.ACK, "dlq", plain))
    node.ok(enqueue("dlq", "no origin", 1, mid=5))
    assert node.ok(C.redrive("dlq", "", [5, gone], 10))[1][0][:2] == (5, ResultCode.NO_ORIGIN)
    assert node.ok(C.redrive("dlq", "dlq", [5], 10))[1][0][1] == ResultCode.INVALID_LIFECYCLE
    assert node.do(C.redrive("dlq", "missing", None, 10)) == (ResultCode.QUEUE_NOT_FOUND,
                                                              "missing")
    assert node.do(C.redrive("nope", "", None, 10))[0] == ResultCode.QUEUE_NOT_FOUND


def test_the_settings_rules(node: Node) -> None:
    problems = {
        "self": create("a", lifecycle={"dead_letter_queue": "a"}),
        "missing": create("b", lifecycle={"dead_letter_queue": "ghost"}),
        "cycle": update("dlq", lifecycle={"dead_letter_queue": "work"}),
        "negative": create("c", lifecycle={"max_deliveries": -1}),
        "type": create("d", lifecycle={"max_deliveries": "3"}),
        "unknown": create("e", lifecycle={"ttl": 3}),
    }
    for why, op in problems.items():
        code, detail = node.do(op)
        assert code == ResultCode.INVALID_LIFECYCLE and detail.startswith("settings."), why
    assert set(node.sm.queues) == {"dlq", "work"}
    node.run(create("x", lifecycle={"dead_letter_queue": "work"}))   # x -> work -> dlq: fine
    assert node.do(update("dlq", lifecycle={"dead_letter_queue": "x"}))[1].endswith(
        "(dlq -> x -> work -> dlq)")
    code, detail = node.do((C.DELETE_QUEUE, "work"))
    assert code == ResultCode.QUEUE_IN_USE and detail == ["x"]
    node.ok(update("work", 0, 0, 30))                           # lifecycle kept
    settings = node.sm.queues["work"].defn.settings
    assert (settings.ack_timeout, settings.max_deliveries, settings.dead_letter_queue) == \
        (30, 2, "dlq")


# -- max_messages and overflow ---------------------------------------------------------------
def test_a_full_queue_refuses_new_messages_and_changes_nothing(node: Node) -> None:
    node.ok(create("small", lifecycle={"max_messages": 3}))
    ids = [node.ok(enqueue("small", f"m{i}", 1))[0] for i in range(3)]
    node.ok(dequeue("small"))                                  # unacked ones count too
    before = node.store.state(include_meta=False)[1]
    assert node.do(enqueue("small", "x", 1)) == (ResultCode.QUEUE_FULL, None)
    assert node.store.state(include_meta=False)[1] == before
    assert node.sm.queues["small"].stats.rejected_full == 1
    assert node.ok(enqueue("small", "replaced", 1, mid=ids[2]))[0] == ids[2]   # an upsert fits
    node.ok((C.ACK, "small", ids[0]))
    node.ok(enqueue("small", "fits again", 1))
    # a batch is all or nothing; an enqueue_seq stops at the full queue
    assert node.do((C.ENQUEUE_BATCH, [("small", 0, "", 1, "b", None)])) == (
        ResultCode.QUEUE_FULL, "small")
    values, failure = node.ok((C.ENQUEUE_SEQ, [("small", ids[1], "", 1, "same", None),
                                               ("small", 0, "", 1, "new", None)]))
    assert len(values) == 1 and failure == (ResultCode.QUEUE_FULL, "small")


def test_lowering_max_messages_never_deletes(node: Node) -> None:
    node.ok(create("q"))
    for i in range(5):
        node.ok(enqueue("q", f"m{i}", 1))
    node.ok(update("q", lifecycle={"max_messages": 2}))
    assert node.sm.queues["q"].index.ready == 5
    assert node.do(enqueue("q", "x", 1))[0] == ResultCode.QUEUE_FULL


def test_drop_oldest_dead_letters_the_oldest_waiting_message(node: Node) -> None:
    node.ok(create("ring", lifecycle={"max_messages": 3, "overflow": "drop_oldest",
                                      "dead_letter_queue": "dlq"}))
    ids = [node.ok(enqueue("ring", f"m{i}", 9 - i))[0] for i in range(3)]
    node.ok(dequeue("ring"))                     # m2 (lowest priority) is delivered
    newest = node.ok(enqueue("ring", "m3", 1))[0]
    assert node.ok((C.GET, "dlq", ids[0]))[4]["x-dead-reason"] == "overflow"
    assert node.sm.queues["ring"].stats.dead_lettered == {"overflow": 1}
    assert {node.ok((C.GET, "ring", m))[3] for m in (ids[1], ids[2], newest)} == \
        {"m1", "m2", "m3"}
    # lowered below what it holds: an enqueue drops down to the limit
    node.ok(update("ring", lifecycle={"max_messages": 2}))
    node.ok(enqueue("ring", "m4", 1))
    q = node.sm.queues["ring"]
    assert q.index.ready + len(q.unacked) == 2
    # nothing waiting to drop (all delivered): refused
    node.drain_ids("ring", ack=False)
    assert node.do(enqueue("ring", "m5", 1))[0] == ResultCode.QUEUE_FULL
    # a batch needing more drops than there are waiting messages is refused whole
    node.ok(update("ring", lifecycle={"max_messages": 3}))
    assert node.do((C.ENQUEUE_BATCH, [("ring", 0, "", 1, f"b{i}", None) for i in range(3)]))[0] \
        == ResultCode.QUEUE_FULL


# -- a full dead-letter queue, a full redrive target ------------------------------
def full_dlq(node: Node, overflow: str = "reject") -> int:
    """The fixture's dlq limited to 1 message and holding one: the id of that message."""
    node.ok(update("dlq", lifecycle={"max_messages": 1, "overflow": overflow}))
    return node.ok(enqueue("dlq", "already here", 0))[0]


def test_a_full_dead_letter_queue_that_refuses_leaves_each_message_where_it_was(
        node: Node) -> None:
    full_dlq(node)
    mid = node.ok(enqueue("work", "job", 5, "g"))[0]
    node.ok(dequeue("work"))
    before = node.store.state(include_meta=False)[1]
    code, detail = node.do(C.reject("work", mid, "bad"))          # refused, still delivered
    assert code == ResultCode.QUEUE_FULL and "'dlq' is full" in detail
    assert node.store.state(include_meta=False)[1] == before and mid in node.sm.queues[
        "work"].unacked
    node.ok(nack("work", mid, 0, None))
    node.ok(dequeue("work"))                                       # its last delivery
    priority, _, dead, refused = node.ok(nack("work", mid, 0, None, "again"))
    assert (priority, dead) == (5, False) and "max_messages 1, overflow reject" in refused
    assert node.ok((C.GET, "work", mid))[5:7] == (2, "again")      # back, waiting
    node.ok(dequeue("work"))
    assert node.ok(requeue(), now_ms=T0 + 10_000) == 1            # timed out: stays too
    assert node.sm.queues["work"].index.contains(mid)
    assert node.sm.queues["work"].stats.dead_letter_refused == {"max_deliveries": 2}
    assert node.sm.queues["dlq"].index.ready == 1


def test_an_expired_message_waits_for_room_and_is_never_delivered(node: Node) -> None:
    from doq_lib.fsm.lifecycle import DEAD_LETTER_RETRY_MS
    first = full_dlq(node)
    mid = node.ok(C.enqueue("work", 0, "g", 1, "short-lived", None, "", 1))[0]
    later = T0 + 2_000
    assert node.ok(requeue(), now_ms=later) == 0                   # swept, refused: held
    assert node.do(dequeue("work"), later)[0] == ResultCode.QUEUE_EMPTY
    assert node.sm.queues["work"].stats.dead_letter_refused == {"expired": 1}
    node.restart()                                                 # the hold is stored
    assert node.do(dequeue("work"), later + 10)[0] == ResultCode.QUEUE_EMPTY
    node.ok((C.DELETE, "dlq", first))                              # room again
    assert node.do(dequeue("work"), later + DEAD_LETTER_RETRY_MS)[0] == ResultCode.QUEUE_EMPTY
    node.ok(requeue(), now_ms=later + DEAD_LETTER_RETRY_MS)
    assert node.ok((C.GET, "dlq", mid))[4]["x-dead-reason"] == "expired"


def test_a_dead_letter_queue_with_drop_oldest_makes_room(node: Node) -> None:
    first = full_dlq(node, "drop_oldest")
    mid = node.ok(enqueue("work", "job", 5, "g"))[0]
    node.ok(dequeue("work"))
    node.ok(C.reject("work", mid, "bad"))
    assert node.do((C.GET, "dlq", first))[0] == ResultCode.MESSAGE_NOT_FOUND   # dropped
    assert node.ok((C.GET, "dlq", mid))[4]["x-dead-reason"] == "rejected"
    assert node.sm.queues["dlq"].stats.dead_lettered == {"overflow": 1}


def test_overflow_into_a_full_dead_letter_queue_refuses_the_enqueue(node: Node) -> None:
    full_dlq(node)
    node.ok(create("ring", lifecycle={"max_messages": 1, "overflow": "drop_oldest",
                                      "dead_letter_queue": "dlq"}))
    oldest = node.ok(enqueue("ring", "old", 1))[0]
    assert node.do(enqueue("ring", "new", 1))[0] == ResultCode.QUEUE_FULL
    assert node.ok((C.GET, "ring", oldest))[3] == "old"


def test_a_batch_counts_the_room_its_queues_share_in_one_dead_letter_queue(
        node: Node) -> None:
    node.ok(update("dlq", lifecycle={"max_messages": 1}))          # room for one
    for name in ("a", "b"):
        node.ok(create(name, lifecycle={"max_messages": 1, "overflow": "drop_oldest",
                                        "dead_letter_queue": "dlq"}))
        node.ok(enqueue(name, f"{name} old", 1))
    before = node.store.state(include_meta=False)[1]
    batch = (C.ENQUEUE_BATCH, [("a", 0, "", 1, "a new", None), ("b", 0, "", 1, "b new", None)])
    assert node.do(batch) == (ResultCode.QUEUE_FULL, "b")          # two drops, one slot
    assert node.store.state(include_meta=False)[1] == before       # nothing of it applied
    assert node.do((C.ENQUEUE_BATCH, batch[1][:1]))[0] == ResultCode.OK


def test_dead_letter_queues_making_room_for_each_other_stop_at_the_hop_limit(
        node: Node) -> None:
    """A chain of full drop_oldest dead-letter queues is followed at most
    MAX_DEAD_LETTER_HOPS deep (no recursion a chain can deepen past that)."""
    from doq_lib.fsm.lifecycle import MAX_DEAD_LETTER_HOPS
    names = [f"c{i}" for i in range(MAX_DEAD_LETTER_HOPS + 3)]
    for n, name in enumerate(reversed(names)):
        settings = {"max_messages": 1, "overflow": "drop_oldest"}
        if n:
            settings["dead_letter_queue"] = names[len(names) - n]
        node.ok(create(name, lifecycle=settings))
        node.ok(enqueue(name, "full", 1))
    assert node.do(enqueue(names[0], "one more", 1))[0] == ResultCode.QUEUE_FULL
    node.ok(update(names[-1], lifecycle={"max_messages": 0}))     # the end takes anything
    node.ok(update(names[0], lifecycle={"dead_letter_queue": names[-1]}))
    assert node.do(enqueue(names[0], "one more", 1))[0] == ResultCode.OK


def test_redrive_follows_the_target_queues_overflow_rule(node: Node) -> None:
    dead = spend(node, "dead")
    node.ok(update("work", lifecycle={"max_messages": 1}))
    held = node.ok(enqueue("work", "holds the only place", 1, "g"))[0]
    moved, failed = node.ok(C.redrive("dlq", "", [dead], 10))
    assert moved == 0 and failed[0][:2] == (dead, ResultCode.QUEUE_FULL)
    assert "'work' is full" in failed[0][2] and node.sm.queues["dlq"].index.contains(dead)
    node.ok(update("work", lifecycle={"overflow": "drop_oldest"}))
    assert node.ok(C.redrive("dlq", "", [dead], 10)) == (1, [])
    assert node.ok((C.GET, "work", dead))[3] == "dead"
    assert node.ok((C.GET, "dlq", held))[4]["x-dead-reason"] == "overflow"


def test_x_dead_from_is_trusted_only_from_a_queue_that_dead_letters_here(node: Node) -> None:
    """a producer could write x-dead-from into a dead-letter queue and steer an
    admin's plain redrive into any queue. (The API refuses the key now; a message stored
    before that still carries it.)"""
    node.ok(create("secret"))
    forged = node.ok(enqueue("dlq", "forged", 1, metadata={"x-dead-from": "secret"}))[0]
    moved, failed = node.ok(C.redrive("dlq", "", [forged], 10))
    assert moved == 0 and failed[0][1] == ResultCode.NO_ORIGIN
    assert "'secret', which does not dead-letter into 'dlq'" in failed[0][2]
    assert node.sm.queues["secret"].index.ready == 0
    assert node.ok(C.redrive("dlq", "secret", [forged], 10)) == (1, [])   # named: moved


def test_the_overflow_setting_rules(node: Node) -> None:
    code, detail = node.do(create("x", lifecycle={"overflow": "drop_newest"}))
    assert code == ResultCode.INVALID_LIFECYCLE and detail.startswith("settings.overflow")
    code, detail = node.do(create("x", lifecycle={"max_messages": -5}))
    assert code == ResultCode.INVALID_LIFECYCLE and detail.startswith("settings.max_messages")


# -- the dedup window ------------------------------------------------------------------------
def test_a_key_seen_within_the_window_stores_nothing_even_after_an_ack(node: Node) -> None:
    node.ok(create("q", lifecycle={"dedup_window": 60}))
    first = node.ok(C.enqueue("q", 0, "", 1, "a", None, "order-7"))
    assert not first.duplicate                                  # stored
    before = node.store.state(include_meta=False)[1]
    again = node.ok(C.enqueue("q", 0, "", 1, "b", None, "order-7"), now_ms=T0 + 59_999)
    assert again.id == first.id and again.duplicate
    assert node.store.state(include_meta=False)[1] == before      # nothing stored
    node.ok(dequeue("q", True))                                   # acked and gone: still seen
    assert node.ok(C.enqueue("q", 0, "", 1, "c", None, "order-7"),
                   now_ms=T0 + 59_999).duplicate
    assert node.sm.queues["q"].stats.deduplicated == 2
    # after the window: a new message
    later = node.ok(C.enqueue("q", 0, "", 1, "d", None, "order-7"), now_ms=T0 + 60_000)
    assert not later.duplicate and later.id != first.id
    node.restart()                                                # keys survive a restart
    assert node.ok(C.enqueue("q", 0, "", 1, "e", None, "order-7"),
                   now_ms=T0 + 61_000)[:1] == (later[0],)


def test_without_a_key_the_client_id_is_the_key(node: Node) -> None:
    node.ok(create("q", lifecycle={"dedup_window": 10}))
    node.ok(enqueue("q", "a", 1, mid=42))
    assert node.ok(enqueue("q", "b", 1, mid=42)).duplicate        # not an upsert any more
    assert node.ok((C.GET, "q", 42))[3] == "a"
    node.ok(create("plain"))                                       # window 0: upsert as before
    node.ok(enqueue("plain", "a", 1, mid=42))
    assert not node.ok(enqueue("plain", "b", 1, mid=42)).duplicate
    assert node.ok((C.GET, "plain", 42))[3] == "b"


def test_a_dedup_key_and_a_client_id_are_kept_apart(node: Node) -> None:
    """dedup_key "555" then an enqueue with id 555 answered duplicate and message
    555 never existed; the other way round too."""
    node.ok(create("q", lifecycle={"dedup_window": 60}))
    first = node.ok(C.enqueue("q", 0, "", 1, "keyed", None, "555"))
    by_id = node.ok(enqueue("q", "with id", 1, mid=555))
    assert not by_id.duplicate and by_id.id == 555                  # stored, not a duplicate
    assert node.ok((C.GET, "q", 555))[3] == "with id"
    node.ok(enqueue("q", "other", 1, mid=777))
    again = node.ok(C.enqueue("q", 0, "", 1, "keyed 777", None, "777"))
    assert not again.duplicate and again.id != 777                      # a new message
    assert node.ok(C.enqueue("q", 0, "", 1, "x", None, "555"))[:1] == (first[0],)
    assert node.ok(enqueue("q", "y", 1, mid=555)).duplicate         # each in its namespace
    node.restart()
    assert node.ok(enqueue("q", "z", 1, mid=777)).duplicate
    assert node.ok(C.enqueue("q", 0, "", 1, "x", None, "777"))[:1] == (again[0],)


def test_keys_pruned_in_the_same_order_on_every_replica(tmp_path: Path) -> None:
    """Keys seen in the same millisecond are pruned in (time, key) order, by a replica that
    restarted as by one that did not (the order used to follow arrival, then the sort)."""
    nodes = [Node(tmp_path / "a"), Node(tmp_path / "b")]
    for n in nodes:
        n.ok(create("q", lifecycle={"dedup_window": 1}))
        n.run(*[C.enqueue("q", 0, "", 1, "x", None, f"k{i:03}") for i in
                reversed(range(300))])
    nodes[1].restart()
    for n in nodes:
        n.ok(C.enqueue("q", 0, "", 1, "x", None, "late"), now_ms=T0 + 5_000)
    assert nodes[0].store.state()[1] == nodes[1].store.state()[1]
    for n in nodes:
        n.close()


def test_keys_are_pruned_and_turning_the_window_off_forgets_them(node: Node) -> None:
    node.ok(create("q", lifecycle={"dedup_window": 1}))
    for i in range(300):
        node.ok(C.enqueue("q", 0, "", 1, "x", None, f"k{i}"))
    assert len(node.store.dump()["dedup"]) == 300
    node.ok(C.enqueue("q", 0, "", 1, "x", None, "late"), now_ms=T0 + 5_000)
    assert len(node.sm.queues["q"].dedup) == 300 - 256 + 1          # a bounded prune per op
    node.ok(update("q", lifecycle={"dedup_window": 0}))
    assert node.sm.queues["q"].dedup == {} and node.store.dump()["dedup"] == {}


def test_a_duplicate_needs_no_room_and_a_batch_dedups_each_item(node: Node) -> None:
    node.ok(create("q", lifecycle={"dedup_window": 60, "max_messages": 2}))
    a = node.ok(C.enqueue("q", 0, "", 1, "a", None, "ka"))[0]
    node.ok(C.enqueue("q", 0, "", 1, "b", None, "kb"))
    assert node.ok(C.enqueue("q", 0, "", 1, "a", None, "ka"))[:1] == (a,)   # full, yet fine
    values = node.ok(C.enqueue_batch([("q", 0, "", 1, "a", None, "ka"),
                                      ("q", 0, "", 1, "b", None, "kb")]))
    assert [v.duplicate for v in values] == [True, True]
    assert node.do(C.enqueue_batch([("q", 0, "", 1, "c", None, "kc")]))[0] == \
        ResultCode.QUEUE_FULL


# -- nack delays and back-off --------------------------------------------------------------
def test_a_nack_delay_holds_the_message_until_the_leaders_time_passes_it(node: Node) -> None:
    node.ok(create("q", "fair", RR, 0, 10))
    mid = node.ok(enqueue("q", "later", 1, "g"))[0]
    other = node.ok(enqueue("q", "now", 1, "h"))[0]
    node.ok(dequeue("q"))
    node.ok(C.nack("q", mid, 0, None, "busy", 30))
    q = node.sm.queues["q"]
    assert mid in q.held and q.waiting == 2 and node.sm.holds[0][0] == T0 + 30_000
    assert node.ok(dequeue("q"))[0] == other                  # the other group is served
    node.ok((C.ACK, "q", other))
    assert node.do(dequeue("q"))[0] == ResultCode.QUEUE_EMPTY
    node.restart()                                            # the hold is stored
    assert mid in node.sm.queues["q"].held
    assert node.ok(requeue(), now_ms=T0 + 29_999) == 0
    assert node.ok(requeue(), now_ms=T0 + 30_000) == 1        # released
    got = node.ok(dequeue("q"), now_ms=T0 + 30_000)
    assert (got.id, got.deliveries, got.last_error) == (mid, 2, "busy")


def test_held_messages_can_be_read_replaced_reprioritized_and_deleted(node: Node) -> None:
    node.ok(create("q"))
    a = node.ok(enqueue("q", "a", 5, mid=11))[0]
    node.ok(dequeue("q"))
    node.ok(C.nack("q", a, 0, None, "", 60))
    assert node.ok((C.GET, "q", a))[3] == "a"
    node.ok(enqueue("q", "a2", 7, mid=11))                    # replaced, still held
    node.ok((C.UPDATE_PRIORITY, "q", a, 3))
    assert node.sm.queues["q"].held[a][2] == 3 and node.sm.queues["q"].index.ready == 0
    assert node.ok(requeue(), now_ms=T0 + 60_000) == 1
    assert node.ok((C.GET, "q", a), now_ms=T0 + 60_000)[2:4] == (3, "a2")
    node.ok(dequeue("q"), now_ms=T0 + 60_000)
    node.ok(C.nack("q", a, 0, None, "", 60), now_ms=T0 + 60_000)
    node.ok((C.DELETE, "q", a), now_ms=T0 + 60_000)
    assert node.sm.queues["q"].held == {} and node.store.dump()["attempts"] == {}
    assert node.ok(requeue(), now_ms=T0 + 200_000) == 0       # its heap entry is stale


def test_back_off_doubles_up_to_its_cap_with_the_same_jitter_everywhere(node: Node,
                                                                        tmp_path: Path) -> None:
    node.ok(create("q", "delayed", 0, 0, 10, {"backoff_initial": 2, "backoff_max": 5}))
    mid = node.ok(enqueue("q", "retry me", 1))[0]
    now, waits = T0, []
    for _ in range(4):
        assert node.ok(dequeue("q"), now_ms=now)[0] == mid
        node.ok(C.nack("q", mid, 0, None), now_ms=now)             # no priority: back-off
        until = node.sm.queues["q"].held[mid][0]
        waits.append(until - now)
        assert node.ok(requeue(), now_ms=until - 1) == 0
        assert node.ok(requeue(), now_ms=until) == 1
        now = until
    for wait, base in zip(waits, (2000, 4000, 5000, 5000)):
        assert base <= wait < base * 1.2 + 1, waits
    assert len(set(w % 1000 for w in waits)) > 1                  # jittered
    # an ack timeout backs off too; a nack with a priority or a delay does not use it
    node.ok(dequeue("q"), now_ms=now)
    assert node.ok(requeue(), now_ms=now + 10_000) == 1            # timed out: held back
    assert node.sm.queues["q"].held[mid][0] >= now + 15_000
    other = Node(tmp_path / "replica")                             # the same on a replica
    try:
        other.run(create("q", "delayed", 0, 0, 10, {"backoff_initial": 2, "backoff_max": 5}))
        other.ok(enqueue("q", "retry me", 1, mid=mid))
        other.ok(dequeue("q"))
        other.ok(C.nack("q", mid, 0, None))
        assert other.sm.queues["q"].held[mid][0] - other.now_ms == waits[0]
    finally:
        other.close()


def test_back_off_settings_rules(node: Node) -> None:
    code, detail = node.do(create("x", lifecycle={"backoff_initial": 10, "backoff_max": 5}))
    assert code == ResultCode.INVALID_LIFECYCLE and detail.startswith("settings.backoff_max")
    node.ok(create("x", lifecycle={"backoff_initial": 10, "backoff_max": 20}))
    assert node.do(update("x", lifecycle={"backoff_max": 5}))[0] == ResultCode.INVALID_LIFECYCLE


# -- message TTL -------------------------------------------------------------------------------
def test_an_expired_message_is_never_delivered_and_is_dead_lettered(node: Node) -> None:
    node.ok(create("t", lifecycle={"message_ttl": 10, "dead_letter_queue": "dlq"}))
    old = node.ok(enqueue("t", "old", 1))[0]
    node.now_ms = T0 + 5_000
    young = node.ok(enqueue("t", "young", 2))[0]
    own = node.ok(C.enqueue("t", 0, "", 0, "own ttl", None, "", 60))[0]       # overrides
    assert node.ok((C.GET, "t", old))[7] == T0 + 10_000
    node.now_ms = T0 + 10_000
    got = node.ok(dequeue("t"))                        # old expired first: never delivered
    assert (got[0], got[7]) == (own, T0 + 5_000 + 60_000)
    meta = node.ok((C.GET, "dlq", old))[4]
    assert meta["x-dead-reason"] == "expired" and meta["x-deliveries"] == "0"
    assert node.sm.queues["t"].stats.dead_lettered == {"expired": 1}
    node.restart()                                     # expiries are stored
    assert node.ok(requeue(), now_ms=T0 + 15_000) == 1            # the leader's sweep
    assert node.do((C.GET, "t", young))[0] == ResultCode.MESSAGE_NOT_FOUND
    assert node.ok((C.GET, "dlq", young))[4]["x-dead-reason"] == "expired"
    node.ok((C.ACK, "t", own), now_ms=T0 + 15_000)
    assert node.sm.queues["t"].expires == {} and node.store.dump()["expiry"] == {}


def test_a_delayed_message_expires_and_a_delivered_one_only_when_it_comes_back(
        node: Node) -> None:
    node.ok(create("t", "delayed", 0, 0, 20, {"message_ttl": 10}))
    future = node.ok(enqueue("t", "tomorrow", (T0 // 1000) + 86400))[0]   # not due in time
    taken = node.ok(enqueue("t", "taken", 1))[0]
    assert node.ok(dequeue("t"))[0] == taken
    assert node.ok(requeue(), now_ms=T0 + 10_000) == 1            # the delayed one expires
    assert node.do((C.GET, "t", future))[0] == ResultCode.MESSAGE_NOT_FOUND
    assert node.do((C.GET, "t", taken))[0] == ResultCode.OK        # delivered: left alone
    assert node.ok(requeue(), now_ms=T0 + 20_000) == 2            # back after its ack
    assert node.do((C.GET, "t", taken))[0] == ResultCode.MESSAGE_NOT_FOUND    # timeout: expired
    assert node.sm.queues["t"].stats.dead_lettered == {"expired": 2}


def test_ttl_settings_rules(node: Node) -> None:
    code, detail = node.do(create("x", lifecycle={"message_ttl": -1}))
    assert code == ResultCode.INVALID_LIFECYCLE and detail.startswith("settings.message_ttl")


def test_a_dead_letter_with_full_metadata_keeps_it_and_restores(node: Node,
                                                                tmp_path: Path) -> None:
    """A message with the most metadata keys a client may give, dead-lettered: the server's
    own x-dead-* keys come on top (they do not count against the limit, as documented);
    the dead letter survives a restart, a backup and its restore, and a redrive brings the
    message back with exactly its own keys."""
    from doq_lib import rules
    from tests.core.test_backup import queue_state, restore, take

    full = {f"k{i:02}": "v" * 8 for i in range(rules.MAX_METADATA)}
    mid = node.ok(enqueue("work", "job", 5, "g", metadata=full))[0]
    node.ok(dequeue("work"))
    node.ok(C.reject("work", mid, "poison"))
    meta = dead_of(node, mid)
    assert len(meta) > rules.MAX_METADATA and {k: meta[k] for k in full} == full
    node.restart()
    target = Node(tmp_path / "target")
    try:
        assert restore(target, take(node))[0] == 0
        assert queue_state(target) == queue_state(node)
    finally:
        target.close()
    moved, failed = node.ok(C.redrive("dlq", "work", [mid], 10))
    assert (moved, failed) == (1, [])
    assert node.ok((C.GET, "work", mid))[4] == full
