"""Replicated operations stay readable: journals and snapshots written by older versions
(tests/data/replay-v1, replay-v2 and replay-v3, made by tests/probes/replay_fixture.py)
rebuild the same queues."""
from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest

from tests.harness import REPO, NodeProc, free_ports, wait_until

FIXTURES = os.path.join(REPO, "tests", "data")


@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
@pytest.mark.parametrize("kind", ["journal", "snapshot"])
def test_an_old_journal_and_snapshot_rebuild_the_same_queues(tmp_path: Any, kind: str,
                                                             version: str) -> None:
    """The node's data without its store: the node rebuilds the store from what Raft kept
    (every operation in the journal; or a snapshot and the journal's tail), and ends with
    the queue state the old code had, byte for byte (the store's queue digest). v1: before
    delivery tokens (its delivery records compared in their first form); v2: with delivery
    tokens, named consumers and settles that enqueue; v3: with schedules (all paused: the
    node fires nothing more)."""
    source = os.path.join(FIXTURES, f"replay-{version}", kind)
    with open(os.path.join(source, "expected.json"), encoding="utf-8") as f:
        expected = json.load(f)
    node_id = expected["node_id"]
    shutil.copytree(os.path.join(source, node_id), os.path.join(tmp_path, node_id))
    # the same Raft address: it is part of the replicated membership
    # no redelivery round while the state is compared: a lease the data left (v2: queue w's,
    # with a 2 s ack timeout) has long run out by now
    node = NodeProc(node_id, free_ports(1)[0], expected["raft_port"], str(tmp_path), [],
                    {"queue.acknowledgement_check_interval": "3600"}, host=expected["host"])
    node.start()
    try:
        wait_until(node.ready, 40, describe=lambda: node.tail(40))
        log = node.tail(200)
        assert ("installing snapshot" in log) == (kind == "snapshot"), log
        fields = ("name", "type", "settings", "ready", "unacked", "total")
        queues = [{k: q[k] for k in fields}
                  for q in node.http().get("/API/v1/queues").json()["queues"]]
        assert queues == expected["queues"]
        assert "Traceback" not in node.tail(400)
        digest = node.state()["queue_digest"]
        if version == "v3":
            listed = node.http().get("/API/v1/queues/cron/schedules").json()["schedules"]
            assert listed == expected["schedules"]
        if version != "v1":
            consumers = node.http().get("/API/v1/queues/w/consumers").json()["consumers"]
            assert [(c["name"], c["held"]) for c in consumers] == [
                ("host:1:alpha", 0), ("host:2:beta", 0), ("host:3:gamma", 1)]
    finally:
        node.stop()
    if version == "v1":
        digest = _first_form_digest(os.path.join(str(tmp_path), node_id, "store"))
    assert digest == expected["queue_digest"]


def _first_form_digest(path: str) -> str:
    """The store's queue digest with each delivery record in the form the old code wrote
    (deadline, slot): a delivery now also records when it was made (the token's time, the
    entry's: not knowable to the old code) and its consumer; the rest is byte for byte."""
    import hashlib

    from doq_lib.lmdb_store import LmdbStore
    from doq_lib.store import DB_NAMES, U64, decode_unacked

    digest = hashlib.sha256()
    store = LmdbStore(path)
    try:
        with store.read() as txn:
            for name in DB_NAMES:
                if name == "meta":
                    continue
                for key, value in txn.items(name):
                    if name == "unacked":
                        deadline, slot, _, consumer = decode_unacked(value)
                        assert consumer == ""                    # old operations name none
                        value = U64.pack(deadline) + slot.encode()
                    digest.update(b"%d:%s:%d:" % (len(key), name.encode(), len(value)))
                    digest.update(key)
                    digest.update(value)
    finally:
        store.close()
    return digest.hexdigest()


# -- constructors and typed views (in-process) ----------------------------------------------------
def _constructed() -> dict[int, Any]:
    """One operation of every code, made by its constructor."""
    from doq_lib import commands as C

    item = ("q", 0, "g", 1, "c", {"k": "v"})
    return {
        C.CREATE_QUEUE: C.create_queue("q", "fair", 1, 3, 60, 1800,
                                       {"max_deliveries": 3, "dead_letter_queue": "dlq"}),
        C.UPDATE_QUEUE: C.update_queue("q", 1, 4, 90, 1800, {"max_deliveries": 5}),
        C.DELETE_QUEUE: C.delete_queue("q"),
        C.ENQUEUE: C.enqueue("q", 7, "g", 5, "body", {"a": "b"}),
        C.DEQUEUE: C.dequeue("q", False, "host:1:w"),
        C.GET: C.get("q", 7), C.DELETE: C.delete("q", 7), C.ACK: C.ack("q", 7, (2, 17)),
        C.NACK: C.nack("q", 7, 3, None, "boom", 0, (1, 5)), C.TOUCH: C.touch("q", 7, (1, 5)),
        C.REJECT: C.reject("q", 7, "bad input", (3, 9)),
        C.REDRIVE: C.redrive("dlq", "q", [7, 8], 10),
        C.UPDATE_PRIORITY: C.update_priority("q", 7, 9),
        C.REQUEUE_EXPIRED: C.requeue_expired(), C.TICK: C.tick(),
        C.LEADER_CONFIG: C.leader_config("n1", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"),
        C.MEMBER_INFO: C.member_info("n1", "127.0.0.1:1", "127.0.0.1:3", "127.0.0.1:2"),
        C.MEMBER_FORGET: C.member_forget("127.0.0.1:1"),
        C.ENQUEUE_BATCH: C.enqueue_batch([C.Item(*item), item]),
        C.DEQUEUE_MANY: C.dequeue_many("q", False, 0, "w"),
        C.ACK_MANY: C.ack_many("q", [1, 2], [None, (1, 4)]),
        C.ENQUEUE_SEQ: C.enqueue_seq([C.Item(*item)]),
        C.RESTORE_BEGIN: C.restore_begin("t"),
        C.RESTORE_PUT: C.restore_put("t", [(1, b"k", b"v"), (2, b"k", None)]),
        C.RESTORE_COMMIT: C.restore_commit("t", True, 1, 5, 99, 3),
        C.RESTORE_ABORT: C.restore_abort("t"),
        C.ACK_IDS: C.ack_ids("q", [1], [(1, 2)]),
        C.NACK_IDS: C.nack_ids("q", [1], 0, {}, "e", 0, [(1, 2)]),
        C.PURGE: C.purge("q", True), C.SET_PAUSED: C.set_paused("q", "a.b", True),
        C.CLUSTER_ID: C.cluster_id("0123456789abcdef" * 2),
        C.SCHEDULE_PUT: C.schedule_put("q", _schedule(), 1_800_000_000_000, True),
        C.SCHEDULE_DELETE: C.schedule_delete("q", "nightly"),
        C.SCHEDULE_PAUSE: C.schedule_pause("q", "nightly", True),
        C.SCHEDULE_FIRE: C.schedule_fire("q", "nightly", 5000, [5000, 6000], 2, 7000),
    }


def _schedule() -> dict[str, Any]:
    from doq_lib import schedules

    return schedules.define("nightly", {"content": "c", "metadata": {"k": "v"}}, 0,
                            cron="0 3 * * *", timezone="Europe/Berlin").to_json()


def _plain(value: Any) -> bool:
    if type(value) in (tuple, list):
        return all(_plain(v) for v in value)
    if type(value) is dict:
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return value is None or type(value) in (str, int, bool, bytes, float)


def test_every_operation_has_a_constructor_of_plain_data_and_a_typed_view() -> None:
    """Each code: its constructor makes only plain tuples, lists, dicts and scalars (the Raft
    log's loader refuses any class), the log's codec carries it unchanged, and decoding
    gives the view of that code with the same fields in the same order."""
    from doq_lib import commands as C
    from doq_lib.raft import wire

    ops = _constructed()
    assert set(ops) == set(C.NAMES) == set(C.VIEWS)
    for code, op in ops.items():
        assert op[0] == code and _plain(op), (C.NAMES[code], op)
        assert wire.loads_command(wire.dumps(op)) == op
        got_code, view = C.decode(op)
        assert got_code == code and isinstance(view, C.VIEWS[code])
        fields = tuple(view)
        assert fields[:len(op) - 1] == op[1:], C.NAMES[code]
        defaults = view._field_defaults                    # trailing fields left out
        assert all(fields[i] == defaults[name] for i, name in enumerate(view._fields)
                   if i >= len(op) - 1), C.NAMES[code]
        assert C.op_size(op) >= 16, C.NAMES[code]          # the committer sizes every one
    batch = C.decode(ops[C.ENQUEUE_BATCH])[1]
    assert C.items_of(batch) == [C.Item("q", 0, "g", 1, "c", {"k": "v"})] * 2
    assert ops[C.NACK_IDS][4] is None and ops[C.DEQUEUE_MANY][3] == 1


def test_decoding_old_short_long_and_unknown_operations() -> None:
    """An operation from before a trailing field existed decodes with its default; fields a
    later version appended are ignored; too few fields or an unknown code is Malformed."""
    from doq_lib import commands as C

    assert C.decode((C.CREATE_QUEUE, "q", "delayed", 0, 0, 0))[1].default_ack_timeout == 0
    assert C.decode((C.UPDATE_QUEUE, "q", 0, 0, 120))[1].ack_timeout == 120
    assert C.decode((C.GET, "q", 5, "from the future"))[1] == C.MessageRef("q", 5)
    assert C.decode((C.ACK, "q", 5))[1] == C.Settle("q", 5, None)      # before tokens
    assert C.decode((C.DEQUEUE, "q", False))[1].consumer == ""
    for bad in [(C.ENQUEUE, "q"), (C.ACK,), (), (99, "q"), ("ack", "q", 1), [C.ACK, "q", 1]]:
        with pytest.raises(C.MalformedOp):
            C.decode(bad)  # type: ignore[arg-type]
    assert C.name_of((C.ACK, "q", 1)) == "ack" and C.name_of(()) == "?"
