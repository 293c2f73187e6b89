"""API keys and roles: the keys file, and every HTTP route and gRPC method refusing
a call without a key (401 / UNAUTHENTICATED), refusing a role or queue it lacks (403 /
PERMISSION_DENIED) and serving the right one. The route and RPC tables are taken from the
code, so a route or RPC without a rule fails here."""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import pytest

from doq_lib import auth
from doq_lib.grpc.api import GRPC_RULES
from doq_lib.http import ROUTES
from doq_lib.http.auth import ROUTE_RULES, ROUTE_VARIANTS
from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.blocking_aio import KINDS, open_client
from tests.harness import DOQ, Cluster, Http, NodeProc, Response, add_key, wait_until

SC = grpc.StatusCode
_n = itertools.count()


# -- the keys file and roles, in process -------------------------------------------------------
def test_roles_allow_what_the_issue_says() -> None:
    R, P, C, A = (auth.Permission.READ, auth.Permission.PRODUCE, auth.Permission.CONSUME,
                  auth.Permission.ADMIN)
    table = {"reader": {R}, "producer": {R, P}, "consumer": {R, C}, "admin": {R, P, C, A}}
    for role, allowed in table.items():
        key = auth.ApiKey("k", role)
        assert {p for p in auth.Permission if key.may(p)} == allowed, role


def test_queue_patterns_limit_queues_listings_and_cluster_operations() -> None:
    key = auth.ApiKey("billing", "admin", queues=("billing.*", "invoices"))
    queue_rule = auth.Rule(auth.Permission.PRODUCE, auth.Scope.QUEUE)
    assert key.problem(queue_rule, "billing.eu") is None
    assert key.problem(queue_rule, "invoices") is None
    assert "may not use queue 'orders'" in str(key.problem(queue_rule, "orders"))
    assert key.problem(auth.Rule(auth.Permission.READ, auth.Scope.ANY)) is None
    assert "limited to queues" in str(key.problem(auth.Rule(auth.Permission.ADMIN,
                                                              auth.Scope.CLUSTER)))
    assert key.covers("billing.x") and not key.covers("billingx")


def test_keys_are_stored_hashed_and_checked(tmp_path: Path) -> None:
    path = str(tmp_path / "keys.yaml")
    secret = auth.new_key()
    assert secret.startswith("doq_") and len(secret) > 40
    auth.write_keys_file(path, [auth.ApiKey("ops", "admin", auth.hash_key(secret))])
    text = Path(path).read_text()
    assert secret not in text and auth.hash_key(secret) in text
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    store = auth.KeyStore.open(path)
    assert store.authenticate(secret) == auth.read_keys_file(path)[0]
    assert store.authenticate(secret + "x") is None and store.authenticate(None) is None


@pytest.mark.parametrize(("document", "message"), [
    ({"keys": [{"name": "a", "role": "root", "sha256": "0" * 64}]}, "role must be one of"),
    ({"keys": [{"name": "", "role": "admin", "sha256": "0" * 64}]}, "name must be"),
    ({"keys": [{"name": "a", "role": "admin", "sha256": "xyz"}]}, "64 hexadecimal"),
    ({"keys": [{"name": "a", "role": "admin", "sha256": "0" * 64},
               {"name": "a", "role": "reader", "sha256": "1" * 64}]}, "used twice"),
    ({"keys": [{"name": "a", "role": "admin", "sha256": "0" * 64},
               {"name": "b", "role": "reader", "sha256": "0" * 64}]}, "listed twice"),
    ({"keys": [{"name": "a", "role": "admin", "sha256": "0" * 64, "queues": "x"}]},
     "list of patterns"),
    ({"keys": [{"name": "a", "role": "admin", "sha256": "0" * 64, "secret": "x"}]},
     "unknown fields"),
    ([1, 2], "expected a mapping"),
])
def test_a_bad_keys_file_is_refused_with_every_problem(document: Any, message: str) -> None:
    with pytest.raises(auth.KeysFileError, match=message):
        auth.parse_keys(document)


def test_key_changes_apply_without_a_restart_and_a_broken_file_keeps_the_old_keys(
        tmp_path: Path) -> None:
    path = str(tmp_path / "keys.yaml")
    first, second = auth.new_key(), auth.new_key()
    auth.write_keys_file(path, [auth.ApiKey("one", "reader", auth.hash_key(first))])
    store = auth.KeyStore.open(path)
    assert store.authenticate(first) is not None and store.authenticate(second) is None
    auth.write_keys_file(path, [auth.ApiKey("two", "admin", auth.hash_key(second))])
    store.refresh(now=time.monotonic() + 5)
    assert store.authenticate(first) is None and store.authenticate(second).name == "two"
    Path(path).write_text("keys: [ {broken")
    store.refresh(now=time.monotonic() + 10)
    assert store.authenticate(second) is not None, "a broken file must not lock everyone out"


# -- a node with keys ---------------------------------------------------------------------------
ROLES = ("admin", "producer", "consumer", "reader")


@dataclass
class Keys:
    by_role: dict[str, str]
    limited: str                 # a producer limited to queues "mine-*"

    def header(self, role: str | None) -> dict[str, str]:
        if role is None:
            return {}
        token = self.limited if role == "limited" else self.by_role[role]
        return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NodeProc, Keys, Path]]:
    root = tmp_path_factory.mktemp("auth")
    path = root / "keys.yaml"
    keys = Keys({role: add_key(path, role, role) for role in ROLES},
                add_key(path, "limited", "producer", "mine-*"))
    c = Cluster(str(root), size=1, flags={"auth.keys_file": str(path),
                                          "grpc.address": "127.0.0.1:0"})
    c.nodes[0].admin_key = keys.by_role["admin"]
    c.start()
    try:
        yield c.nodes[0], keys, path
    finally:
        c.stop()


def _call(http: Http, keys: Keys, role: str | None, method: str, path: str,
          body: Any = None, raw: bytes | None = None,
          content_type: str = "application/json") -> Response:
    headers = keys.header(role)
    if raw is not None:
        headers["Content-Type"] = content_type
    return http.request(method, path, body=body, raw=raw, headers=headers)


class Fixture:
    """Real resources for the requests of the table (made with the admin key)."""

    def __init__(self, node: NodeProc, keys: Keys) -> None:
        self.http = node.http()
        self.keys = keys
        self.node = node
        self.queue = f"q-{next(_n)}"
        self.admin("POST", "/API/v1/queues", {"name": self.queue, "type": "delayed"})

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        r = _call(self.http, self.keys, "admin", method, path, body)
        assert r.status < 300, (method, path, r.status, r.body)
        return r.json() if r.body else None

    def fair(self) -> str:
        """A fair queue (made once per fixture): groups can be paused there."""
        name = f"{self.queue}-fair"
        if not getattr(self, "_fair", False):
            self.admin("POST", "/API/v1/queues", {"name": name, "type": "fair"})
            self._fair = True
        return name

    def scheduled(self) -> str:
        """A new schedule of the fixture's queue (made with the admin key): its name."""
        name = f"s{next(_n)}"
        # paused, and due in a year even once resumed: a firing schedule would change the
        # state digests the tests compare
        self.admin("POST", f"/API/v1/queues/{self.queue}/schedules", {
            "name": name, "every": 3600, "message": {"content": "x"}, "paused": True,
            "start_at": int(time.time()) + 365 * 86400})
        return name

    def ready_id(self) -> str:
        return str(self.admin("POST", f"/API/v1/queues/{self.queue}/messages",
                              {"content": "x", "priority": 1})["id"])

    def unacked_id(self) -> str:
        self.ready_id()
        return str(self.admin("GET", f"/API/v1/queues/{self.queue}/messages")["id"])

    def backup(self) -> bytes:
        r = self.http.request("POST", "/db/backup", body={"since": 0},
                              headers=self.keys.header("admin"))
        assert r.status == 200
        return r.body


# op id -> (the least role that may call it, a role that may not or None, request builder)
Request = Callable[[Fixture], tuple[str, str, Any, bytes | None, str]]


def _j(method: str, path: str, body: Any = None) -> tuple[str, str, Any, bytes | None, str]:
    return method, path, body, None, "application/json"


REQUESTS: dict[str, tuple[str, str | None, Request]] = {
    "generate-id": ("producer", "consumer", lambda f: _j("POST", "/API/v1/ids", {"number": 2})),
    "db-backup": ("admin", "reader", lambda f: _j("POST", "/db/backup", {"since": 0})),
    "db-restore": ("admin", "consumer", lambda f: (
        "POST", "/db/restore", None, f.backup(), "application/octet-stream")),
    "cluster-servers": ("reader", None, lambda f: _j("GET", "/API/v1/cluster/servers")),
    "cluster-join": ("admin", "producer", lambda f: _j(
        "POST", "/API/v1/cluster/join", {"id": "node-0", "addr": f.node.raft_addr})),
    "cluster-leave": ("admin", "reader", lambda f: _j(
        "POST", "/API/v1/cluster/leave", {"id": "nobody"})),
    "create-queue": ("admin", "producer", lambda f: _j(
        "POST", "/API/v1/queues", {"name": f"new-{next(_n)}", "type": "fair"})),
    "queues": ("reader", None, lambda f: _j("GET", "/API/v1/queues")),
    "queue-info": ("reader", "limited", lambda f: _j("GET", f"/API/v1/queues/{f.queue}")),
    "update-queue": ("admin", "consumer", lambda f: _j(
        "PUT", f"/API/v1/queues/{f.queue}", {"settings": {"ack_timeout": 120}})),
    "delete-queue": ("admin", "producer", lambda f: _j("DELETE", f"/API/v1/queues/{f.queue}")),
    "enqueue": ("producer", "consumer", lambda f: _j(
        "POST", f"/API/v1/queues/{f.queue}/messages", {"content": "y", "priority": 1})),
    "enqueue-batch": ("producer", "reader", lambda f: _j(
        "POST", f"/API/v1/queues/{f.queue}/messages/batch",
        {"messages": [{"content": "b", "priority": 1}]})),
    "dequeue": ("consumer", "producer", lambda f: (
        f.ready_id(), _j("GET", f"/API/v1/queues/{f.queue}/messages?ack=true"))[1]),
    "ack-batch": ("consumer", "producer", lambda f: _j(
        "POST", f"/API/v1/queues/{f.queue}/messages/ack", {"ids": [f.unacked_id()]})),
    "nack-batch": ("consumer", "reader", lambda f: _j(
        "POST", f"/API/v1/queues/{f.queue}/messages/nack", {"ids": [f.unacked_id()]})),
    "get": ("reader", "limited", lambda f: _j(
        "GET", f"/API/v1/queues/{f.queue}/messages/{f.ready_id()}")),
    "delete": ("consumer", "producer", lambda f: _j(
        "DELETE", f"/API/v1/queues/{f.queue}/messages/{f.ready_id()}")),
    "ack": ("consumer", "reader", lambda f: _j(
        "POST", f"/API/v1/queues/{f.queue}/messages/{f.unacked_id()}/ack")),
    "nack": ("consumer", "producer", lambda f: _j(
        "POST", f"/API/v1/queues/{f.queue}/messages/{f.unacked_id()}/nack", {"priority": 0})),
    "touch": ("consumer", "producer", lambda f: _j(
        "POST", f"/API/v1/queues/{f.queue}/messages/{f.unacked_id()}/touch")),
    "redrive": ("admin", "consumer", lambda f: _j(
        "POST", f"/API/v1/queues/{f.queue}/redrive", {"count": 1})),
    "reject": ("consumer", "reader", lambda f: _j(
        "POST", f"/API/v1/queues/{f.queue}/messages/{f.unacked_id()}/reject", {"error": "e"})),
    "update-priority": ("consumer", "producer", lambda f: _j(
        "PUT", f"/API/v1/queues/{f.queue}/messages/{f.ready_id()}/priority", {"priority": 9})),
    "purge": ("admin", "consumer", lambda f: _j(
        "POST", f"/API/v1/queues/{f.queue}/purge", {"include_unacked": True})),
    "pause": ("admin", "consumer", lambda f: _j("POST", f"/API/v1/queues/{f.queue}/pause")),
    "resume": ("admin", "producer", lambda f: _j("POST", f"/API/v1/queues/{f.queue}/resume")),
    "pause-group": ("admin", "reader", lambda f: _j(
        "POST", f"/API/v1/queues/{f.fair()}/groups/tenant.a/pause")),
    "resume-group": ("admin", "consumer", lambda f: _j(
        "POST", f"/API/v1/queues/{f.fair()}/groups/tenant.a/resume")),
    "groups": ("reader", "limited", lambda f: _j("GET", f"/API/v1/queues/{f.queue}/groups")),
    "consumers": ("reader", "limited", lambda f: _j(
        "GET", f"/API/v1/queues/{f.queue}/consumers")),
    "browse": ("reader", "limited", lambda f: _j(
        "GET", f"/API/v1/queues/{f.queue}/messages?browse=true&state=all")),
    "explain": ("reader", "limited", lambda f: _j(
        "GET", f"/API/v1/queues/{f.queue}/messages/{f.ready_id()}/explain")),
    "put-schedule": ("admin", "producer", lambda f: _j(
        "POST", f"/API/v1/queues/{f.queue}/schedules",
        {"name": f"p{next(_n)}", "cron": "0 3 * * *", "message": {"content": "x"},
         "paused": True})),
    "schedules": ("reader", "limited", lambda f: _j(
        "GET", f"/API/v1/queues/{f.queue}/schedules")),
    "schedule": ("reader", "limited", lambda f: _j(
        "GET", f"/API/v1/queues/{f.queue}/schedules/{f.scheduled()}")),
    "delete-schedule": ("admin", "consumer", lambda f: _j(
        "DELETE", f"/API/v1/queues/{f.queue}/schedules/{f.scheduled()}")),
    "pause-schedule": ("admin", "producer", lambda f: _j(
        "POST", f"/API/v1/queues/{f.queue}/schedules/{f.scheduled()}/pause")),
    "resume-schedule": ("admin", "reader", lambda f: _j(
        "POST", f"/API/v1/queues/{f.queue}/schedules/{f.scheduled()}/resume")),
    "internal-status": ("admin", "reader", lambda f: _j("GET", "/internal/status")),
    "internal-state": ("admin", "consumer", lambda f: _j("GET", "/internal/state")),
}
# Authorized, but the request itself is refused by the route (no member "nobody").
AUTHORIZED_BUT_REFUSED = {"cluster-leave": 404}


def test_every_route_and_every_rpc_has_a_rule_and_a_case() -> None:
    op_ids = {op_id for _, _, op_id, _ in ROUTES} | {op for _, op in ROUTE_VARIANTS.values()}
    assert op_ids == set(ROUTE_RULES), "a route without an access rule (http/auth.py)"
    assert op_ids == set(REQUESTS), "a route without a case in this test"
    methods = set(pb.DESCRIPTOR.services_by_name["DOQ"].methods_by_name)
    assert methods == set(GRPC_RULES), "an RPC without an access rule (doq_lib/grpc/api.py)"
    assert methods == set(GRPC_CASES), "an RPC without a case in this test"


@pytest.mark.parametrize("op_id", sorted(REQUESTS))
def test_http_route_needs_a_key_of_the_right_role(
        secured: tuple[NodeProc, Keys, Path], op_id: str) -> None:
    node, keys, _ = secured
    right, wrong, build = REQUESTS[op_id]
    fixture = Fixture(node, keys)
    http = node.http()
    for role, status, code in ((None, 401, "unauthenticated"),
                               (wrong, 403, "permission_denied")):
        if role is None and status == 403:
            continue
        method, path, body, raw, ctype = build(fixture)
        before = node.state()["queue_digest"]
        r = _call(http, keys, role, method, path, body, raw, ctype)
        assert r.status == status, (role, r.status, r.body)
        problem = r.json()
        assert problem["code"] == code and problem["errors"][0]["message"]
        if status == 401:
            assert r.headers["www-authenticate"].startswith("Bearer")
        assert node.state()["queue_digest"] == before, "a refused request changed something"
    method, path, body, raw, ctype = build(fixture)
    r = _call(http, keys, right, method, path, body, raw, ctype)
    expected = AUTHORIZED_BUT_REFUSED.get(op_id)
    if expected is None:
        assert r.status < 300, (right, r.status, r.body)
    else:
        assert r.status == expected and r.json()["code"] == "member_not_found", r.body


def test_a_limited_key_sees_and_uses_only_its_queues(
        secured: tuple[NodeProc, Keys, Path]) -> None:
    node, keys, _ = secured
    http = node.http()
    fixture = Fixture(node, keys)
    fixture.admin("POST", "/API/v1/queues", {"name": "mine-1", "type": "delayed"})
    listed = _call(http, keys, "limited", "GET", "/API/v1/queues").json()["queues"]
    assert [q["name"] for q in listed] == ["mine-1"]
    r = _call(http, keys, "limited", "POST", "/API/v1/queues/mine-1/messages",
              {"content": "m", "priority": 1})
    assert r.status == 200
    r = _call(http, keys, "limited", "POST", f"/API/v1/queues/{fixture.queue}/messages",
              {"content": "m", "priority": 1})
    assert r.status == 403 and "limited to mine-*" in r.json()["errors"][0]["message"]


def test_a_limited_admin_cannot_send_dead_letters_outside_its_queues(
        secured: tuple[NodeProc, Keys, Path]) -> None:
    """Naming a dead-letter queue is writing to it: the key must cover that queue too."""
    node, keys, path = secured
    http = node.http()
    fixture = Fixture(node, keys)                      # fixture.queue: outside mine-*
    token = add_key(path, "limited-admin", "admin", "mine-*")
    headers = {"Authorization": f"Bearer {token}"}

    def attempt(name: str, dlq: str) -> Response | None:
        r = http.request("POST", "/API/v1/queues", headers=headers, body={
            "name": name, "type": "delayed", "settings": {"dead_letter_queue": dlq}})
        return None if r.status == 401 else r          # the keys file is not reloaded yet

    def create(name: str, dlq: str) -> Response:
        return wait_until(lambda: attempt(name, dlq), timeout=10)  # type: ignore[no-any-return]
    before = node.state()["queue_digest"]
    r = create("mine-dl", fixture.queue)
    assert r.status == 403 and "limited to mine-*" in r.json()["errors"][0]["message"], r.body
    r = http.request("PUT", "/API/v1/queues/mine-1", headers=headers,
                     body={"settings": {"dead_letter_queue": fixture.queue}})
    assert r.status == 403, r.body
    assert node.state()["queue_digest"] == before
    assert create("mine-dlq", "").status == 200
    assert create("mine-work", "mine-dlq").status == 200
    # a redrive must name its target: the x-dead-from of a message may be any queue
    r = http.request("POST", "/API/v1/queues/mine-dlq/redrive", headers=headers, body={})
    assert r.status == 403 and "must name the target" in r.body.decode(), r.body
    r = http.request("POST", "/API/v1/queues/mine-dlq/redrive", headers=headers,
                     body={"to": fixture.queue})
    assert r.status == 403, r.body
    r = http.request("POST", "/API/v1/queues/mine-dlq/redrive", headers=headers,
                     body={"to": "mine-work"})
    assert r.status == 200 and r.json() == {"moved": 0, "failed": []}, r.body


def test_a_settle_stores_its_items_only_where_the_key_may_produce(
        secured: tuple[NodeProc, Keys, Path]) -> None:
    """An ack, nack or reject with items enqueues: a consumer key (which may not
    produce) or a key limited to other queues is refused (403 / PERMISSION_DENIED) and
    nothing changes; an admin key may."""
    node, keys, path = secured
    http = node.http()
    fixture = Fixture(node, keys)
    item = {"queue": fixture.queue, "content": "result", "priority": 1}
    mid = fixture.unacked_id()
    before = node.state()["queue_digest"]
    for role in ("consumer", "reader"):
        r = _call(http, keys, role, "POST", f"/API/v1/queues/{fixture.queue}/messages/{mid}/ack",
                  {"enqueue": [item]})
        assert r.status == 403, (role, r.body)
    channel = grpc.insecure_channel(_grpc_target(node, keys))
    try:
        stub = pb_grpc.DOQStub(channel)
        for call in (stub.Ack, stub.Reject):
            request = (pb.AckRequest if call is stub.Ack else pb.RejectRequest)(
                queueName=fixture.queue, id=int(mid), enqueue=[pb.EnqueueRequest(
                    queueName=fixture.queue, content="result", priority=1)])
            with pytest.raises(grpc.RpcError) as caught:
                call(request, metadata=(("authorization",
                                         keys.header("consumer")["Authorization"]),))
            assert caught.value.code() == SC.PERMISSION_DENIED, caught.value.details()
    finally:
        channel.close()
    assert node.state()["queue_digest"] == before
    r = _call(http, keys, "admin", "POST", f"/API/v1/queues/{fixture.queue}/messages/{mid}/ack",
              {"enqueue": [item]})
    assert r.status == 200 and len(r.json()["ids"]) == 1, r.body


def test_a_limited_key_learns_no_queue_name_outside_its_patterns(
        secured: tuple[NodeProc, Keys, Path]) -> None:
    """a key limited to queue patterns learnt other queues' names from a 409's list
    of the queues using a dead-letter queue, from dead_letter_queue in the queue's info and
    from a dead letter's x-dead-from. Each is shown only when the key may see it."""
    node, keys, path = secured
    http = node.http()
    admin = {"Authorization": f"Bearer {keys.by_role['admin']}"}
    tag = next(_n)
    dlq, secret, own = f"shared-dlq-{tag}", f"secret-{tag}", f"shared-own-{tag}"
    for name, settings in ((dlq, {}), (secret, {"dead_letter_queue": dlq}),
                           (own, {"dead_letter_queue": dlq})):
        assert http.request("POST", "/API/v1/queues", headers=admin, body={
            "name": name, "type": "delayed", "settings": settings}).status == 200
    mid = http.request("POST", f"/API/v1/queues/{secret}/messages", headers=admin,
                       body={"content": "poison", "priority": 1}).json()["id"]
    assert http.request("GET", f"/API/v1/queues/{secret}/messages", headers=admin).status == 200
    assert http.request("POST", f"/API/v1/queues/{secret}/messages/{mid}/reject",
                        headers=admin, body={}).status == 200
    token = add_key(path, f"shared-{tag}", "admin", "shared-*")
    mine = {"Authorization": f"Bearer {token}"}
    wait_until(lambda: http.request("GET", f"/API/v1/queues/{dlq}", headers=mine).status
               == 200, timeout=10)
    r = http.request("DELETE", f"/API/v1/queues/{dlq}", headers=mine)
    detail = r.json()["errors"][0]["message"]
    assert r.status == 409 and f"'{own}'" in detail and secret not in detail, detail
    assert "and 1 queue your key may not see" in detail
    r = http.request("DELETE", f"/API/v1/queues/{dlq}", headers=admin)     # admin: both named
    assert r.status == 409 and secret in r.json()["errors"][0]["message"]
    info = http.request("GET", f"/API/v1/queues/{own}", headers=mine).json()
    assert info["settings"]["dead_letter_queue"] == dlq and "dead_letter_queue_hidden" not in info
    assert http.request("PUT", f"/API/v1/queues/{own}", headers=admin, body={
        "settings": {"dead_letter_queue": ""}}).status == 200
    got = http.request("GET", f"/API/v1/queues/{dlq}/messages/{mid}", headers=mine).json()
    assert "x-dead-from" not in got["metadata"] and got["metadata"]["x-dead-reason"] == \
        "rejected"
    got = http.request("GET", f"/API/v1/queues/{dlq}/messages/{mid}", headers=admin).json()
    assert got["metadata"]["x-dead-from"] == secret
    browsed = http.request("GET", f"/API/v1/queues/{dlq}/messages?browse=true",
                           headers=mine).json()["messages"]
    assert browsed and all("x-dead-from" not in m.get("metadata", {}) for m in browsed)
    # gRPC: the same answers
    channel = grpc.insecure_channel(_grpc_target(node, keys))
    stub = pb_grpc.DOQStub(channel)
    md = (("authorization", f"Bearer {token}"),)
    got = stub.Get(pb.GetRequest(queueName=dlq, id=int(mid)), metadata=md, timeout=10)
    assert "x-dead-from" not in got.metadata and got.metadata["x-dead-reason"] == "rejected"
    page = stub.BrowseMessages(pb.BrowseRequest(queueName=dlq), metadata=md, timeout=10)
    assert page.messages and "x-dead-from" not in page.messages[0].message.metadata
    with pytest.raises(grpc.RpcError) as info_err:
        stub.DeleteQueue(pb.DeleteQueueRequest(name=dlq), metadata=md, timeout=10)
    assert secret not in info_err.value.details() and "may not see" in info_err.value.details()
    taken = stub.Dequeue(pb.DequeueRequest(queueName=dlq), metadata=md, timeout=10)
    assert "x-dead-from" not in taken.metadata
    channel.close()


def test_a_dead_letter_queue_outside_the_keys_patterns_is_hidden(
        secured: tuple[NodeProc, Keys, Path]) -> None:
    node, keys, path = secured
    http = node.http()
    admin = {"Authorization": f"Bearer {keys.by_role['admin']}"}
    tag = next(_n)
    hidden, work = f"hidden-dlq-{tag}", f"seen-work-{tag}"
    for name, settings in ((hidden, {}), (work, {"dead_letter_queue": hidden})):
        assert http.request("POST", "/API/v1/queues", headers=admin, body={
            "name": name, "type": "delayed", "settings": settings}).status == 200
    token = add_key(path, f"seen-{tag}", "reader", "seen-*")
    mine = {"Authorization": f"Bearer {token}"}
    info = wait_until(lambda: (lambda r: r.json() if r.status == 200 else None)(
        http.request("GET", f"/API/v1/queues/{work}", headers=mine)), timeout=10)
    assert "dead_letter_queue" not in info["settings"] and info["dead_letter_queue_hidden"]
    listed = http.request("GET", "/API/v1/queues", headers=mine).json()["queues"]
    assert [q.get("dead_letter_queue_hidden") for q in listed if q["name"] == work] == [True]
    channel = grpc.insecure_channel(_grpc_target(node, keys))
    stub = pb_grpc.DOQStub(channel)
    got = stub.GetQueue(pb.GetQueueRequest(name=work),
                        metadata=(("authorization", f"Bearer {token}"),), timeout=10)
    assert got.dead_letter_queue_hidden and not got.settings.HasField("dead_letter_queue")
    got = stub.GetQueue(pb.GetQueueRequest(name=work),
                        metadata=(("authorization", f"Bearer {keys.by_role['admin']}"),),
                        timeout=10)
    assert not got.dead_letter_queue_hidden and got.settings.dead_letter_queue == hidden
    # creating it again shows the stored definition, and hides the same name
    creator = add_key(path, f"seen-admin-{tag}", "admin", "seen-*")
    again = wait_until(lambda: (lambda r: r.json() if r.status == 200 else None)(
        http.request("POST", "/API/v1/queues", headers={"Authorization": f"Bearer {creator}"},
                     body={"name": work, "type": "delayed"})), timeout=10)
    assert again["existed"] and again["dead_letter_queue_hidden"]
    assert "dead_letter_queue" not in again["settings"]
    made = stub.CreateQueue(pb.CreateQueueRequest(name=work, type="delayed",
                                                  settings=pb.QueueSettings()),
                            metadata=(("authorization", f"Bearer {creator}"),), timeout=10)
    assert made.existed and made.dead_letter_queue_hidden
    assert not made.settings.HasField("dead_letter_queue")
    channel.close()


def test_metrics_need_an_unlimited_reader(secured: tuple[NodeProc, Keys, Path]) -> None:
    node, keys, _ = secured
    http = node.http()
    assert _call(http, keys, None, "GET", "/metrics").status == 401
    assert _call(http, keys, "limited", "GET", "/metrics").status == 403
    r = _call(http, keys, "reader", "GET", "/metrics")
    assert r.status == 200 and b"doq_" in r.body
    for public in ("/healthz", "/livez", "/readyz", "/openapi.json", "/", "/docs"):
        assert http.get(public).status == 200, public


def test_keys_added_and_revoked_take_effect_without_a_restart(
        secured: tuple[NodeProc, Keys, Path]) -> None:
    node, keys, path = secured
    http = node.http()
    token = add_key(path, f"temp-{next(_n)}", "reader")
    header = {"Authorization": f"Bearer {token}"}
    wait_until(lambda: http.get("/API/v1/queues", headers=header).status == 200, 10)
    name = [k.name for k in auth.read_keys_file(str(path)) if k.sha256 == auth.hash_key(token)]
    done = subprocess.run([sys.executable, DOQ, "keys", "revoke", f"--keys-file={path}",
                           f"--name={name[0]}"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    wait_until(lambda: http.get("/API/v1/queues", headers=header).status == 401, 10)
    listed = subprocess.run([sys.executable, DOQ, "keys", "list", f"--keys-file={path}"],
                            capture_output=True, text=True, timeout=60)
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert listed.returncode == 0 and rows[0] == ["NAME", "ROLE", "QUEUES", "CREATED",
                                                  "SHA-256"]
    assert ["limited", "producer", "mine-*"] in [row[:3] for row in rows[1:]], listed.stdout
    assert token not in Path(path).read_text()


def test_a_bad_key_scheme_and_a_revoked_looking_key_are_401(
        secured: tuple[NodeProc, Keys, Path]) -> None:
    node, keys, _ = secured
    http = node.http()
    for header in ({"Authorization": "Basic YTpi"}, {"Authorization": "Bearer nope"},
                   {"Authorization": "Bearer"}):
        r = http.get("/API/v1/queues", headers=header)
        assert r.status == 401 and r.json()["code"] == "unauthenticated", header


# -- gRPC -------------------------------------------------------------------------------------
def _grpc_target(node: NodeProc, keys: Keys) -> str:
    status = node.http().get("/internal/status", headers=keys.header("admin")).json()
    return str(status["grpc_addr"])


GrpcCase = Callable[[Any, Fixture, tuple[tuple[str, str], ...]], Any]
Metadata = tuple[tuple[str, str], ...]


def _unary(rpc: str, make: Callable[[Fixture], Any]) -> GrpcCase:
    def call(stub: Any, f: Fixture, md: Metadata) -> Any:
        return getattr(stub, rpc)(make(f), metadata=md, timeout=10)
    return call


def _enqueue_stream(stub: Any, f: Fixture, md: Metadata) -> Any:
    request = pb.EnqueueRequest(queueName=f.queue, content="s", priority=1)
    return list(stub.EnqueueStream(iter([request]), metadata=md, timeout=10))


def _batch_stream(stub: Any, f: Fixture, md: Metadata) -> Any:
    request = pb.EnqueueBatchRequest(messages=[pb.EnqueueRequest(queueName=f.queue,
                                                                 content="b", priority=1)])
    return list(stub.EnqueueBatchStream(iter([request]), metadata=md, timeout=10))


def _dequeue_stream(stub: Any, f: Fixture, md: Metadata) -> Any:
    f.ready_id()
    stream = stub.DequeueStream(iter([pb.DequeueRequest(queueName=f.queue, ack=True)]),
                                metadata=md, timeout=10)
    return next(stream)


def _ready(f: Fixture) -> int:
    return int(f.ready_id())


def _unacked(f: Fixture) -> int:
    return int(f.unacked_id())


GRPC_CASES: dict[str, tuple[str, str | None, GrpcCase]] = {
    "GenerateIDs": ("producer", "reader", _unary(
        "GenerateIDs", lambda f: pb.GenerateIDsRequest(number=1))),
    "CreateQueue": ("admin", "consumer", _unary("CreateQueue", lambda f: pb.CreateQueueRequest(
        name=f"g-{next(_n)}", type="delayed", settings=pb.QueueSettings()))),
    "UpdateQueue": ("admin", "producer", _unary("UpdateQueue", lambda f: pb.UpdateQueueRequest(
        name=f.queue, settings=pb.QueueSettings(ack_timeout=60)))),
    "DeleteQueue": ("admin", "reader", _unary(
        "DeleteQueue", lambda f: pb.DeleteQueueRequest(name=f.queue))),
    "GetQueue": ("reader", "limited", _unary(
        "GetQueue", lambda f: pb.GetQueueRequest(name=f.queue))),
    "GetQueues": ("reader", None, _unary("GetQueues", lambda f: pb.GetQueuesRequest())),
    "Enqueue": ("producer", "consumer", _unary("Enqueue", lambda f: pb.EnqueueRequest(
        queueName=f.queue, content="e", priority=1))),
    "EnqueueBatch": ("producer", "reader", _unary("EnqueueBatch", lambda f: (
        pb.EnqueueBatchRequest(messages=[pb.EnqueueRequest(queueName=f.queue, content="b")])))),
    "EnqueueStream": ("producer", "consumer", _enqueue_stream),
    "EnqueueBatchStream": ("producer", "limited", _batch_stream),
    "Dequeue": ("consumer", "producer", _unary("Dequeue", lambda f: (
        f.ready_id(), pb.DequeueRequest(queueName=f.queue, ack=True))[1])),
    "DequeueStream": ("consumer", "reader", _dequeue_stream),
    "Get": ("reader", "limited", _unary("Get", lambda f: pb.GetRequest(
        queueName=f.queue, id=_ready(f)))),
    "Delete": ("consumer", "producer", _unary("Delete", lambda f: pb.DeleteRequest(
        queueName=f.queue, id=_ready(f)))),
    "Ack": ("consumer", "producer", _unary("Ack", lambda f: pb.AckRequest(
        queueName=f.queue, id=_unacked(f)))),
    "AckBatch": ("consumer", "reader", _unary("AckBatch", lambda f: pb.AckBatchRequest(
        queueName=f.queue, ids=[_unacked(f)]))),
    "Nack": ("consumer", "producer", _unary("Nack", lambda f: pb.NackRequest(
        queueName=f.queue, id=_unacked(f)))),
    "Touch": ("consumer", "reader", _unary("Touch", lambda f: pb.TouchRequest(
        queueName=f.queue, id=_unacked(f)))),
    "Redrive": ("admin", "consumer", _unary("Redrive", lambda f: pb.RedriveRequest(
        queueName=f.queue, count=1))),
    "Reject": ("consumer", "producer", _unary("Reject", lambda f: pb.RejectRequest(
        queueName=f.queue, id=_unacked(f)))),
    "UpdatePriority": ("consumer", "producer", _unary(
        "UpdatePriority", lambda f: pb.UpdatePriorityRequest(queueName=f.queue, id=_ready(f),
                                                             priority=3))),
    "PurgeQueue": ("admin", "consumer", _unary("PurgeQueue", lambda f: pb.PurgeQueueRequest(
        queueName=f.queue, include_unacked=True))),
    "PauseQueue": ("admin", "producer", _unary("PauseQueue", lambda f: pb.QueueControlRequest(
        queueName=f.queue))),
    "ResumeQueue": ("admin", "reader", _unary("ResumeQueue", lambda f: pb.QueueControlRequest(
        queueName=f.queue))),
    "PauseGroup": ("admin", "consumer", _unary("PauseGroup", lambda f: pb.GroupControlRequest(
        queueName=f.fair(), group="g"))),
    "ResumeGroup": ("admin", "producer", _unary("ResumeGroup", lambda f: (
        pb.GroupControlRequest(queueName=f.fair(), group="g")))),
    "GetGroups": ("reader", "limited", _unary("GetGroups", lambda f: pb.GetGroupsRequest(
        queueName=f.queue))),
    "GetConsumers": ("reader", "limited", _unary("GetConsumers", lambda f: (
        pb.GetConsumersRequest(queueName=f.queue)))),
    "BrowseMessages": ("reader", "limited", _unary("BrowseMessages", lambda f: (
        pb.BrowseRequest(queueName=f.queue)))),
    "ExplainMessage": ("reader", "limited", _unary("ExplainMessage", lambda f: (
        pb.ExplainRequest(queueName=f.queue, id=_ready(f))))),
    "PutSchedule": ("admin", "consumer", _unary("PutSchedule", lambda f: (
        pb.PutScheduleRequest(queueName=f.queue, paused=True, schedule=pb.ScheduleDefinition(
            name=f"p{next(_n)}", every=60, message=pb.ScheduleMessage(content="x")))))),
    "GetSchedules": ("reader", "limited", _unary("GetSchedules", lambda f: (
        pb.GetSchedulesRequest(queueName=f.queue)))),
    "DeleteSchedule": ("admin", "producer", _unary("DeleteSchedule", lambda f: (
        pb.ScheduleRequest(queueName=f.queue, name=f.scheduled())))),
    "PauseSchedule": ("admin", "reader", _unary("PauseSchedule", lambda f: (
        pb.ScheduleRequest(queueName=f.queue, name=f.scheduled())))),
    "ResumeSchedule": ("admin", "consumer", _unary("ResumeSchedule", lambda f: (
        pb.ScheduleRequest(queueName=f.queue, name=f.scheduled())))),
}


@pytest.mark.parametrize("rpc", sorted(GRPC_CASES))
def test_grpc_method_needs_a_key_of_the_right_role(
        secured: tuple[NodeProc, Keys, Path], rpc: str) -> None:
    node, keys, _ = secured
    fixture = Fixture(node, keys)
    channel = grpc.insecure_channel(_grpc_target(node, keys))
    try:
        stub = pb_grpc.DOQStub(channel)
        right, wrong, call = GRPC_CASES[rpc]
        md = {role: (("authorization", keys.header(role)["Authorization"]),)
              for role in (*ROLES, "limited")}
        for role, status in ((None, SC.UNAUTHENTICATED), (wrong, SC.PERMISSION_DENIED)):
            if role is None and status == SC.PERMISSION_DENIED:
                continue
            before = node.state()["queue_digest"]
            with pytest.raises(grpc.RpcError) as caught:
                call(stub, fixture, md[role] if role else ())
            assert caught.value.code() == status, (role, caught.value.details())
            trailer = dict(caught.value.trailing_metadata() or ())
            assert trailer.get("doq-error-code") in ("unauthenticated", "permission_denied")
            assert node.state()["queue_digest"] == before or rpc in NEEDS_SETUP
        call(stub, fixture, md[right])
    finally:
        channel.close()


# Their refused calls first make a message (with the admin key) to act on.
NEEDS_SETUP = {"Dequeue", "DequeueStream", "Get", "Delete", "Ack", "AckBatch", "Nack",
               "Touch", "UpdatePriority", "Reject", "PauseGroup", "ResumeGroup",
               "ExplainMessage", "DeleteSchedule", "PauseSchedule", "ResumeSchedule"}


def test_the_python_client_sends_its_key(secured: tuple[NodeProc, Keys, Path]) -> None:
    from doq_lib.client import connect
    from doq_lib.errors import PermissionDenied, Unauthenticated

    node, keys, _ = secured
    url = f"http://127.0.0.1:{node.http_port}"
    with pytest.raises(Unauthenticated):
        connect(url).queues()
    with pytest.raises(Unauthenticated):
        open_client(url, "http-async").queues()
    for transport in KINDS:                       # blocking and asyncio clients
        with open_client(url, transport, api_key=keys.by_role["producer"]) as client:
            queue = f"c-{next(_n)}"
            with pytest.raises(PermissionDenied):
                client.create_queue(queue)
            with connect(url, api_key=keys.by_role["admin"]) as admin:
                admin.create_queue(queue)
            assert client.enqueue(queue, "hello").id > 0
            assert queue in [q.name for q in client.queues()]


def test_cli_backup_and_restore_send_the_key(secured: tuple[NodeProc, Keys, Path],
                                             tmp_path: Path) -> None:
    node, keys, _ = secured
    url = f"http://127.0.0.1:{node.http_port}"
    out = tmp_path / "full.bak"
    env = {k: v for k, v in os.environ.items() if k != "DOQ_API_KEY"}
    denied = subprocess.run([sys.executable, DOQ, "backup", f"--url={url}", f"--output={out}"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert denied.returncode == 1 and "API key is required" in denied.stderr
    done = subprocess.run([sys.executable, DOQ, "backup", f"--url={url}", f"--output={out}"],
                          capture_output=True, text=True, timeout=120,
                          env={**env, "DOQ_API_KEY": keys.by_role["admin"]})
    assert done.returncode == 0, done.stderr
    done = subprocess.run([sys.executable, DOQ, "restore", f"--url={url}", f"--full={out}",
                           f"--api-key={keys.by_role['admin']}"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["backups"] == 1
