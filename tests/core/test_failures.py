"""doq_lib/failures.py: one table words every failure, for the service and both transports."""
from __future__ import annotations

import os
import re

import pytest

from doq_lib import commands as C
from doq_lib.backup import BadBackup
from doq_lib.errors import (
    Conflict,
    DoqError,
    InternalError,
    InvalidSettings,
    MessageNotFound,
    NotLeader,
    NotUnacked,
    QueueEmpty,
    QueueNotFound,
    ResultCode,
    Unavailable,
)
from doq_lib.failures import (
    API,
    GRPC_TEXT,
    RESULTS,
    error_for_item,
    error_for_result,
    http_failure,
)
from tests.harness import REPO

R = ResultCode


def test_every_route_and_every_rpc_has_its_wording() -> None:
    from doq_lib.http import ROUTES
    from doq_lib.http.auth import ROUTE_VARIANTS
    from doq_lib.pb import doq_pb2 as pb

    variants = {op for _, op in ROUTE_VARIANTS.values()}
    assert {op for _, _, op, _ in ROUTES} | variants == set(API)
    rpcs = {m.name for m in pb.DESCRIPTOR.services_by_name["DOQ"].methods}
    assert set(GRPC_TEXT) == rpcs
    assert all(GRPC_TEXT.values())
    assert set(RESULTS) - {"*"} <= set(C.NAMES.values())


@pytest.mark.parametrize(("operation", "code", "queue", "detail", "cls", "message"), [
    ("enqueue", R.QUEUE_NOT_FOUND, "q", None, QueueNotFound, "Failed to get a queue: q"),
    ("dequeue", R.QUEUE_EMPTY, "q", None, QueueEmpty, "Queue is empty: q"),
    ("dequeue_many", R.QUEUE_EMPTY, "q", None, QueueEmpty, "Queue is empty: q"),
    ("create_queue", R.INVALID_SETTINGS, "q", "invalid strategy", InvalidSettings,
     "Failed to create a queue: q: invalid strategy"),
    ("update_queue", R.QUEUE_NOT_FOUND, "q", None, QueueNotFound, "Failed to update a queue: q"),
    ("delete_queue", R.QUEUE_NOT_FOUND, "q", None, QueueNotFound, "Failed to delete a queue: q"),
    ("enqueue_batch", R.QUEUE_NOT_FOUND, "", "other", QueueNotFound,
     "Failed to get a queue: other"),
    ("get", R.MESSAGE_NOT_FOUND, "q", None, MessageNotFound,
     "Failed to get a message from a queue: q"),
    ("update_priority", R.MESSAGE_NOT_FOUND, "q", None, MessageNotFound,
     "Failed to dequeue a message from a queue: q"),
    ("ack", R.NOT_UNACKED, "q", None, NotUnacked, "Message not found: q"),
    ("restore_put", R.RESTORE_CONFLICT, "", "another restore started", Conflict,
     "another restore started"),
    ("touch", R.EXPIRED, "q", None, Unavailable,
     "refused: the write reached the cluster after its deadline"),
    ("enqueue_seq", R.INTERNAL, "q", None, InternalError, "enqueue failed"),
    # a code the operation cannot answer with: a bug, named as such
    ("ack", R.QUEUE_EMPTY, "q", None, InternalError, "ack failed: QUEUE_EMPTY"),
    ("get", R.INTERNAL, "q", "internal error", InternalError, "get failed: internal error"),
])
def test_a_result_code_becomes_the_operations_error(operation: str, code: int, queue: str,
                                                    detail: object, cls: type[DoqError],
                                                    message: str) -> None:
    error = error_for_result(operation, code, queue, detail)
    assert type(error) is cls and error.message == message


def test_every_wording_of_the_table_fills_in() -> None:
    for operation, codes in RESULTS.items():
        for code in codes:
            message = error_for_result(operation, code, "q", "why").message
            assert "{" not in message and message, (operation, code)
    assert isinstance(error_for_item("q", 5, R.MESSAGE_NOT_FOUND), MessageNotFound)
    assert error_for_item("q", 5, R.NOT_UNACKED).message == \
        "message 5 is not delivered and unacknowledged"
    assert error_for_item("q", 5, R.INTERNAL).message == \
        "message 5 is not delivered and unacknowledged"


@pytest.mark.parametrize(("op_id", "error", "status", "detail"), [
    ("enqueue", QueueNotFound("Failed to get a queue: q"), 409, "Failed to enqueue a message"),
    ("dequeue", QueueEmpty("Queue is empty: q"), 400, "Failed to dequeue a message from a queue"),
    ("enqueue", Unavailable("no quorum"), 503, "Failed to enqueue a message"),
    ("ack", InternalError("ack failed"), 500, "Failed to ack a message from a queue"),
    ("cluster-join", Conflict("a change is in progress"), 409, "unexpected error occurred"),
    ("db-backup", NotLeader("Only leader can make a backup"), 400,
     "Only leader can make a backup"),
    ("db-restore", BadBackup("torn"), 400, "invalid backup file"),
    ("db-restore", Conflict("another restore"), 409, "Conflict"),
    ("db-restore", Unavailable("no quorum"), 503, "Failed to restore database"),
    ("db-backup", InternalError("disk"), 500, "unexpected error occurred"),
])
def test_an_error_becomes_the_routes_http_answer(op_id: str, error: DoqError, status: int,
                                                 detail: str) -> None:
    assert http_failure(op_id, error) == (status, detail)


def test_failure_wording_lives_only_in_the_table() -> None:
    """The wording of the table is written nowhere else in doq_lib (one place to change it)."""
    phrases = ["Failed to get a queue", "Queue is empty", "Message not found:",
               "Failed to enqueue a message", "failed to enqueue a message",
               "Failed to dequeue a message from a queue", "unexpected error occurred",
               "is not delivered and unacknowledged"]
    lib = os.path.join(REPO, "doq_lib")
    found = []
    for root, _, files in os.walk(lib):
        for name in files:
            path = os.path.join(root, name)
            if not name.endswith(".py") or path.endswith(os.path.join("doq_lib", "failures.py")):
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
            found.extend(f"{os.path.relpath(path, REPO)}: {p}" for p in phrases
                         if re.search(re.escape(p), text))
    assert not found
