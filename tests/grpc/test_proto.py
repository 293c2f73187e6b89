"""The committed gRPC code matches proto/doq.proto, and the contract keeps its wire numbers."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from doq_lib.pb import doq_pb2

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("doq_pb2.py", "doq_pb2.pyi", "doq_pb2_grpc.py")


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    work = tmp_path / "repo"
    (work / "doq_lib" / "pb").mkdir(parents=True)
    shutil.copytree(ROOT / "proto", work / "proto")
    shutil.copy(ROOT / "scripts" / "gen_proto.sh", work / "gen_proto.sh")
    env = dict(os.environ, PY=sys.executable)
    subprocess.run(["sh", "gen_proto.sh"], cwd=work, env=env, check=True)
    for name in GENERATED:
        fresh = (work / "doq_lib" / "pb" / name).read_text()
        committed = (ROOT / "doq_lib" / "pb" / name).read_text()
        assert fresh == committed, f"doq_lib/pb/{name} is stale: run scripts/gen_proto.sh"


def _fields(message: str) -> dict[str, int]:
    desc = doq_pb2.DESCRIPTOR.message_types_by_name[message]
    return {f.name: f.number for f in desc.fields}


MESSAGE_FIELDS = ("success", "queueName", "id", "group", "priority", "content", "metadata")


def test_wire_numbers_are_those_of_the_contract() -> None:
    assert doq_pb2.DESCRIPTOR.package == "queue"
    service = doq_pb2.DESCRIPTOR.services_by_name["DOQ"]
    assert service.full_name == "queue.DOQ"
    original = ["GenerateIDs", "CreateQueue", "UpdateQueue", "DeleteQueue", "GetQueue",
                "GetQueues", "Enqueue", "EnqueueStream", "Dequeue", "DequeueStream", "Get",
                "Delete", "Ack", "Nack", "UpdatePriority", "Touch"]
    assert [m.name for m in service.methods][:16] == original
    assert _fields("EnqueueRequest") == {"queueName": 1, "id": 2, "group": 3, "priority": 4,
                                         "content": 5, "metadata": 6, "dedup_key": 7,
                                         "ttl": 8, "delay": 9}
    assert _fields("EnqueueResponse") == {**{f: i for i, f in enumerate(MESSAGE_FIELDS, 1)},
                                          "duplicate": 8}
    # DOQ extensions: new numbers only
    assert _fields("GetResponse") == {**{f: i for i, f in enumerate(MESSAGE_FIELDS, 1)},
                                      "deliveries": 8, "last_error": 9, "expires_at": 10,
                                      "delivery": 11}
    assert _fields("DequeueResponse") == {**{f: i for i, f in enumerate(MESSAGE_FIELDS, 1)},
                                          "messages": 8, "deliveries": 9, "last_error": 10,
                                          "expires_at": 11, "delivery": 12}
    assert _fields("DequeueRequest") == {"queueName": 1, "ack": 2, "credit": 3, "max_batch": 4,
                                         "consumer": 5}
    assert _fields("QueueSettings") == {"strategy": 1, "max_unacked": 2, "ack_timeout": 3,
                                        "max_deliveries": 4, "dead_letter_queue": 5,
                                        "max_messages": 6, "overflow": 7, "dedup_window": 8,
                                        "backoff_initial": 9, "backoff_max": 10,
                                        "message_ttl": 11, "max_in_flight": 12,
                                        "group_rate": 13, "group_burst": 14}
    assert _fields("Message") == {"group": 1, "id": 2, "priority": 3, "content": 4,
                                  "metadata": 5, "deliveries": 6, "last_error": 7,
                                  "expires_at": 8, "delivery": 9}
    assert _fields("NackResponse") == {"success": 1, "dead_lettered": 2,
                                       "dead_letter_refused": 3, "ids": 4}
    assert _fields("AckResponse") == {"success": 1, "ids": 2}
    assert _fields("RejectResponse") == {"success": 1, "ids": 2}
    assert _fields("RejectRequest") == {"queueName": 1, "id": 2, "error": 3, "delivery": 4,
                                        "enqueue": 5, "reason": 6}
    assert _fields("AckRequest") == {"queueName": 1, "id": 2, "delivery": 3, "enqueue": 4}
    assert _fields("TouchRequest") == {"queueName": 1, "id": 2, "delivery": 3}
    assert _fields("AckBatchRequest") == {"queueName": 1, "ids": 2, "deliveries": 3,
                                          "enqueue": 4}
    assert _fields("AckBatchResponse") == {"success": 1, "failed_ids": 2, "enqueued": 3,
                                           "failures": 4}
    assert _fields("SettleEnqueue") == {"messages": 1}
    assert _fields("StoredIds") == {"ids": 1}
    assert _fields("RedriveRequest") == {"queueName": 1, "to": 2, "ids": 3, "count": 4}
    assert _fields("RedriveResponse") == {"success": 1, "moved": 2, "failed": 3}
    assert _fields("Stats") == {"enqueueRPS": 1, "dequeueRPS": 2, "ackRPS": 3, "nackRPS": 4}
    assert _fields("GetQueueResponse") == {"name": 1, "type": 2, "settings": 3, "stats": 4,
                                           "ready": 5, "unacked": 6, "total": 7,
                                           "paused": 8, "paused_groups": 9,
                                           "dead_letter_queue_hidden": 10}
    assert _fields("PurgeQueueRequest") == {"queueName": 1, "include_unacked": 2}
    assert _fields("PurgeQueueResponse") == {"success": 1, "purged": 2}
    assert _fields("QueueControlRequest") == {"queueName": 1}
    assert _fields("GroupControlRequest") == {"queueName": 1, "group": 2}
    assert _fields("ControlResponse") == {"success": 1, "changed": 2}
    assert _fields("GroupInfo") == {"group": 1, "ready": 2, "unacked": 3, "paused": 4,
                                    "paused_by": 5}
    assert _fields("GetGroupsResponse") == {"groups": 1}
    assert _fields("BrowseRequest") == {"queueName": 1, "state": 2, "group": 3, "after": 4,
                                        "limit": 5}
    assert _fields("BrowsedMessage") == {"message": 1, "state": 2, "deadline": 3,
                                         "consumer": 4, "delivered_at": 5}
    assert _fields("BrowseResponse") == {"messages": 1, "next": 2}
    assert _fields("ExplainRequest") == {"queueName": 1, "id": 2}
    assert _fields("ExplainReason") == {"code": 1, "group": 2, "until": 3, "next_at": 4,
                                        "unacked": 5, "max": 6, "in_flight": 7}
    assert _fields("ExplainResponse") == {"id": 1, "state": 2, "reasons": 3, "ahead": 4,
                                          "held_by": 5, "held_since": 6}
    assert _fields("GetConsumersRequest") == {"queueName": 1}
    assert _fields("ConsumerInfo") == {"name": 1, "held": 2, "messages": 3,
                                       "oldest_lease_ms": 4, "last_seen": 5, "deliveries": 6,
                                       "acks": 7, "nacks": 8}
    assert _fields("GetConsumersResponse") == {"consumers": 1}
    assert _fields("NackRequest") == {"queueName": 1, "id": 2, "priority": 3, "metadata": 4,
                                      "error": 5, "delay": 6, "delivery": 7, "enqueue": 8}
    # schedules
    assert _fields("ScheduleMessage") == {"content": 1, "priority": 2, "group": 3,
                                          "metadata": 4, "ttl": 5}
    assert _fields("ScheduleDefinition") == {"name": 1, "cron": 2, "every": 3, "timezone": 4,
                                             "message": 5, "start_at": 6, "end_at": 7,
                                             "catch_up": 8, "grace": 9}
    assert _fields("PutScheduleRequest") == {"queueName": 1, "schedule": 2, "paused": 3}
    assert _fields("ScheduleInfo") == {"schedule": 1, "paused": 2, "next_at": 3,
                                       "last_fired": 4, "fired": 5, "skipped": 6,
                                       "refused": 7, "last_error": 8, "created_at": 9}
    assert _fields("PutScheduleResponse") == {"success": 1, "status": 2, "schedule": 3}
    assert _fields("GetSchedulesRequest") == {"queueName": 1, "name": 2}
    assert _fields("GetSchedulesResponse") == {"schedules": 1}
    assert _fields("ScheduleRequest") == {"queueName": 1, "name": 2}
    assert _fields("RaftCommand")["touch"] == 14
    strategy = doq_pb2.QueueSettings.Strategy
    assert [strategy.Name(i) for i in range(3)] == ["STRATEGY_UNSPECIFIED", "ROUND_ROBIN",
                                                    "WEIGHTED"]


def test_an_original_client_encoding_decodes_unchanged() -> None:
    # EnqueueRequest{queueName:"q", id:7, content:"x"} as bytes an original client sends.
    raw = b"\x0a\x01q\x10\x07\x2a\x01x"
    request = doq_pb2.EnqueueRequest.FromString(raw)
    assert (request.queueName, request.id, request.content) == ("q", 7, "x")
    assert request.SerializeToString() == raw
