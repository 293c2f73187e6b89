"""Writes a node's Raft journal and snapshot holding every kind of replicated operation,
and what the queues held when the node stopped. ``test_commands.py`` starts a node on a copy
(without its store, so the node rebuilds it from the snapshot and the journal) and expects
the same queues.

tests/data/replay-v1 was made by the code of 2026-12-02 (commit 9d59cf0), with
:func:`operations` only; tests/data/replay-v2 by the code of 2026-12-04, with
:func:`issue28_operations` too: delivery tokens, named consumers, settles that enqueue;
tests/data/replay-v3 by the code of 2026-12-05, with :func:`schedule_operations` too.

Kept to show how the data was made; running it again writes data of *today's* code, which is
not the point of the test (old journals must keep replaying), so only do that for a new
format version, in a new folder.

    python -m tests.probes.replay_fixture <out dir>
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import grpc

from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from doq_lib.raft.snapshot import snapshot_path
from tests.harness import NodeProc, free_ports, wait_until

NODE_ID, RAFT_HOST, RAFT_PORT = "node-0", "127.0.93.17", 29717
LONG = 10 * 365 * 86400         # ack timeout: nothing delivered expires in a test's life time


def _ok(response: Any, status: int = 200) -> Any:
    assert response.status == status, (response.status, response.body[:300])
    return response.json() if response.body else None


def operations(http: Any, stub: Any) -> None:
    """Every operation code of doq_lib/commands.py but MEMBER_FORGET (a member that left a
    cluster) and RESTORE_ABORT (a restore that fails after every check passed)."""
    post, put, get, delete = http.post, http.put, http.get, http.delete
    _ok(post("/API/v1/queues", {"name": "d", "type": "delayed",
                                "settings": {"ack_timeout": LONG}}))
    _ok(post("/API/v1/queues", {"name": "f", "type": "fair",
                                "settings": {"strategy": "weighted", "max_unacked": 3,
                                             "ack_timeout": LONG}}))
    _ok(post("/API/v1/queues", {"name": "gone", "type": "delayed"}))
    _ok(put("/API/v1/queues/f", {"settings": {"strategy": "weighted", "max_unacked": 2,
                                              "ack_timeout": LONG}}))
    _ok(delete("/API/v1/queues/gone"))
    ids = []
    for i in range(30):
        body = {"content": f"d{i}", "priority": 100 - i}
        if i % 3 == 0:
            body["metadata"] = {"k": str(i), "trace": "x" * i}
        ids.append(int(_ok(post("/API/v1/queues/d/messages", body))["id"]))
    _ok(post("/API/v1/queues/d/messages", {"content": "mine", "priority": 5,
                                           "id": "123456789"}))
    batch = [{"content": f"f{i}", "priority": i, "group": f"g{i % 3}.s{i % 2}"}
             for i in range(24)]
    _ok(post("/API/v1/queues/f/messages/batch", {"messages": batch}))
    _ok(get("/API/v1/queues/d/messages?ack=true"))                    # DEQUEUE, acked
    _ok(get(f"/API/v1/queues/d/messages/{ids[5]}"))                     # GET
    held = _ok(get("/API/v1/queues/d/messages?ack=false"))              # DEQUEUE, unacked
    _ok(post(f"/API/v1/queues/d/messages/{held['id']}/touch"))
    _ok(post(f"/API/v1/queues/d/messages/{held['id']}/nack",
             {"priority": 7, "metadata": {"why": "again"}}))
    _ok(put(f"/API/v1/queues/d/messages/{ids[10]}/priority", {"priority": 1}))
    _ok(delete(f"/API/v1/queues/d/messages/{ids[11]}"), 204)
    many = _ok(get("/API/v1/queues/d/messages?ack=false&count=6"))["messages"]   # DEQUEUE_MANY
    _ok(post("/API/v1/queues/d/messages/ack", {"ids": [m["id"] for m in many[:2]]}))  # ACK_IDS
    _ok(post("/API/v1/queues/d/messages/nack",                                      # NACK_IDS
             {"ids": [m["id"] for m in many[2:4]], "priority": 3}))
    fair = _ok(get("/API/v1/queues/f/messages?ack=false&count=4"))["messages"]
    _ok(post(f"/API/v1/queues/f/messages/{fair[0]['id']}/ack"))                     # ACK
    # gRPC: EnqueueStream (ENQUEUE_SEQ) and AckBatch (ACK_MANY)
    answers = list(stub.EnqueueStream(iter([
        pb.EnqueueRequest(queueName="d", priority=1000 + i, content=f"s{i}",
                          metadata={"via": "stream"}) for i in range(5)]), timeout=20))
    assert all(a.success for a in answers)
    taken = _ok(get("/API/v1/queues/d/messages?ack=false&count=3"))["messages"]
    done = stub.AckBatch(pb.AckBatchRequest(queueName="d", ids=[int(taken[0]["id"]), 1]),
                         timeout=20)
    assert list(done.failed_ids) == [1]
    # REQUEUE_EXPIRED: queue r has the node's default ack timeout (2 s, see make_one); TICK:
    # the leader's clock while nothing else happens for a second
    _ok(post("/API/v1/queues", {"name": "r", "type": "delayed"}))
    for i in range(2):
        _ok(post("/API/v1/queues/r/messages", {"content": f"r{i}", "priority": i}))
    _ok(get("/API/v1/queues/r/messages?ack=false"))
    wait_until(lambda: _ok(get("/API/v1/queues/r"))["unacked"] == 0, 30)
    time.sleep(2.5)
    issue28_operations(http, stub)
    schedule_operations(http)


def schedule_operations(http: Any) -> None:
    """The operations added on 2026-12-05: SCHEDULE_PUT (created, replaced), SCHEDULE_DELETE,
    SCHEDULE_PAUSE, the leader's SCHEDULE_FIRE, ACK_IDS storing messages per id, and an
    enqueue's delay. Every schedule ends paused, so a node replaying the data fires nothing
    more, whenever that is."""
    post, get = http.post, http.get
    _ok(post("/API/v1/queues", {"name": "cron", "type": "fair"}))
    base = "/API/v1/queues/cron/schedules"
    _ok(post(base, {"name": "nightly", "cron": "30 2 * * *", "timezone": "Europe/Berlin",
                    "catch_up": "all", "message": {"content": "n", "metadata": {"k": "v"}}}))
    _ok(post(base, {"name": "tick", "every": 1, "grace": 5,
                    "message": {"content": "t", "group": "g", "priority": 2}}))
    _ok(post(base, {"name": "gone", "every": 60, "message": {"content": "x"}}))
    _ok(http.delete(f"{base}/gone"))
    wait_until(lambda: _ok(get(f"{base}/tick"))["fired"] >= 3, 30)
    _ok(post(f"{base}/tick/pause"))
    _ok(post(f"{base}/nightly/pause"))
    _ok(post(base, {"name": "nightly", "cron": "45 2 * * *", "timezone": "Europe/Berlin",
                    "message": {"content": "n2"}}))
    # a batch ack whose ids store messages with their acks, and enqueues with a delay
    # (a day: still held when the node stops)
    msgs = "/API/v1/queues/cron/messages"
    _ok(post(f"{msgs}/batch", {"messages": [
        {"content": f"b{i}", "priority": 1, "group": "g"} for i in range(3)]}))
    _ok(post(msgs, {"content": "tomorrow", "priority": 1, "group": "h", "delay": 86400}))
    taken = _ok(get(f"{msgs}?ack=false&count=3&consumer=host:4:delta"))["messages"]
    _ok(post(f"{msgs}/ack", {"ids": [
        {"id": taken[0]["id"], "delivery": taken[0]["delivery"],
         "enqueue": [{"queue": "d", "content": "next", "priority": 9, "delay": 86400}]},
        {"id": taken[1]["id"], "enqueue": [{"queue": "nope", "content": "x", "priority": 1}]},
        taken[2]["id"]]}))


def issue28_operations(http: Any, stub: Any) -> None:
    """The fields added on 2026-12-04: named consumers (DEQUEUE, DEQUEUE_MANY), settles fenced by
    delivery tokens (ACK, NACK, TOUCH, REJECT, ACK_IDS, NACK_IDS, ACK_MANY) and settles that
    store messages with them."""
    post, get = http.post, http.get
    _ok(post("/API/v1/queues", {"name": "w", "type": "fair",
                                "settings": {"ack_timeout": LONG}}))
    _ok(post("/API/v1/queues", {"name": "w-dlq", "type": "delayed"}))
    # (replay-v2 was made without ack_timeout here: w's leases took the node's default, 2 s)
    _ok(http.put("/API/v1/queues/w", {"settings": {"dead_letter_queue": "w-dlq",
                                                   "ack_timeout": LONG}}))
    _ok(post("/API/v1/queues/w/messages/batch", {"messages": [
        {"content": f"w{i}", "priority": 1, "group": f"t{i % 4}"} for i in range(16)]}))
    base = "/API/v1/queues/w/messages"
    one = _ok(get(f"{base}?ack=false&consumer=host:1:alpha"))
    _ok(post(f"{base}/{one['id']}/touch?delivery={one['delivery']}"))
    _ok(post(f"{base}/{one['id']}/ack", {"delivery": one["delivery"], "enqueue": [
        {"queue": "d", "content": "result", "priority": 3, "metadata": {"from": one["id"]}}]}))
    many = _ok(get(f"{base}?ack=false&count=6&consumer=host:2:beta"))["messages"]
    _ok(post(f"{base}/ack", {"ids": [{"id": m["id"], "delivery": m["delivery"]}
                                     for m in many[:2]]}))
    _ok(post(f"{base}/nack", {"ids": [{"id": many[2]["id"], "delivery": many[2]["delivery"]}],
                              "priority": 2}))
    _ok(post(f"{base}/{many[3]['id']}/nack", {"delivery": many[3]["delivery"], "error": "e",
                                              "enqueue": [{"queue": "w", "content": "retry",
                                                           "priority": 1, "group": "t9"}]}))
    _ok(post(f"{base}/{many[4]['id']}/reject", {"delivery": many[4]["delivery"],
                                                "error": "bad"}))
    done = stub.AckBatch(pb.AckBatchRequest(queueName="w", ids=[int(many[5]["id"])],
                                            deliveries=[many[5]["delivery"]]), timeout=20)
    assert list(done.failed_ids) == []
    stale = post(f"{base}/{many[5]['id']}/ack", {"delivery": many[5]["delivery"]})
    assert stale.status == 409                                 # refused: nothing changes
    _ok(get(f"{base}?ack=false&consumer=host:3:gamma"))         # held when the node stops


def restore(http: Any) -> None:
    """RESTORE_BEGIN / PUT / COMMIT: the node restores a backup of itself taken just now."""
    response = http.post("/db/backup", {})
    data = _backup_bytes(response)
    _ok(http.request("POST", "/db/restore", raw=data,
                     headers={"Content-Type": "application/octet-stream"}))


def _backup_bytes(response: Any) -> bytes:
    assert response.status == 200, response.status
    return bytes(response.body)


def snapshot_taken(node_dir: str) -> bool:
    return os.path.exists(snapshot_path(node_dir))


QUEUE_FIELDS = ("name", "type", "settings", "ready", "unacked", "total")


def make_one(out: str, snapshot: bool) -> None:
    """One node's data: with ``snapshot`` a snapshot early on and the rest in the journal,
    else every operation in the journal."""
    root = tempfile.mkdtemp(prefix="replay-fixture-")
    grpc_port, http_port = free_ports(2)
    flags = {"grpc.address": f"127.0.0.1:{grpc_port}",
             "queue.default_acknowledgement_timeout": "2"}
    if snapshot:
        flags["raft.snapshot_min_entries"] = "25"
    # The Raft address is part of the replicated membership: a test that replays this data
    # must give the node the same one, so it is fixed (on a loopback address of its own).
    node = NodeProc(NODE_ID, http_port, RAFT_PORT, root, [], flags, host=RAFT_HOST)
    node.start()
    wait_until(node.ready, 30, describe=lambda: node.tail(40))
    try:
        http = node.http()
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        operations(http, pb_grpc.DOQStub(channel))
        restore(http)
        node_dir = os.path.join(node.data_dir, node.node_id)
        if snapshot:
            wait_until(lambda: snapshot_taken(node_dir), 30)
        # a few more, so that with a snapshot the journal holds state too
        _ok(http.post("/API/v1/queues/d/messages", {"content": "after", "priority": 2}))
        _ok(http.get("/API/v1/queues/d/messages?ack=false"))
        state = node.state()
        queues = [{k: q[k] for k in QUEUE_FIELDS}
                  for q in _ok(http.get("/API/v1/queues"))["queues"]]
        schedules = _ok(http.get("/API/v1/queues/cron/schedules"))["schedules"]
        channel.close()
        node.stop()
        assert snapshot_taken(node_dir) == snapshot
        os.makedirs(out, exist_ok=True)
        shutil.copytree(node_dir, os.path.join(out, node.node_id),
                        ignore=shutil.ignore_patterns("store", "*.tmp", "*.log"))
        with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
            json.dump({"node_id": node.node_id, "host": RAFT_HOST, "raft_port": RAFT_PORT,
                       "queue_digest": state["queue_digest"],
                       "queues": queues, "schedules": schedules}, f, indent=1,
                      sort_keys=True)
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


def make(out: str) -> None:
    make_one(os.path.join(out, "journal"), snapshot=False)
    make_one(os.path.join(out, "snapshot"), snapshot=True)


if __name__ == "__main__":
    make(sys.argv[1])
