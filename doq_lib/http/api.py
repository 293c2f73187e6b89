"""The REST API's route handlers (L5): :class:`Api` and the route table ``ROUTES`` (SPEC §3)."""
from __future__ import annotations

import contextlib
import json
from typing import Any, Callable, Iterator

import bottle

from doq_lib import rules
from doq_lib.auth import DEAD_FROM, shown_metadata
from doq_lib.cluster import RELAYED_HEADER, Membership
from doq_lib.errors import DoqError, NotLeader, PermissionDenied, QueueNotFound, ResultCode
from doq_lib.failures import error_for_result
from doq_lib.http import schema
from doq_lib.http.auth import KEY_ENVIRON, ROUTE_RULES, Authorizer
from doq_lib.http.calls import CURRENT_CALL, REASONS, ClientWatch, HttpProblem, relay, reply
from doq_lib.http.controls import ROUTES as CONTROL_ROUTES
from doq_lib.http.controls import ControlsApi
from doq_lib.http.parsing import (
    batch_ids,
    check_queue_name,
    delivery_of,
    enqueue_id,
    json_body,
    path_id,
    query_ack,
    query_consumer,
    query_count,
    query_flag,
    query_wait,
    settle_body,
    settle_ids,
    spool_body,
)
from doq_lib.http.schedules import ROUTES as SCHEDULE_ROUTES
from doq_lib.http.schedules import SchedulesApi
from doq_lib.models import LIFECYCLE_SETTINGS, Message, QueueInfo, QueueSettings, Strategy
from doq_lib.service import EnqueueItem, Service


def _settled(done_key: str, ids: list[int], failed: list[tuple[int, DoqError]]) -> bytes:
    return reply(200, _settled_out(done_key, ids, failed))


def _settled_out(done_key: str, ids: list[int],
                 failed: list[tuple[int, DoqError]]) -> dict[str, Any]:
    bad = {mid for mid, _ in failed}
    return {done_key: [str(mid) for mid in ids if mid not in bad],
            "failed": [{"id": str(mid), "code": exc.code, "detail": exc.message}
                       for mid, exc in failed]}


def _with_ids(out: dict[str, Any], items: list[EnqueueItem], ids: list[int]) -> dict[str, Any]:
    """A settle's answer, with the ids of the messages stored with it (when it had any)."""
    if items:
        out["ids"] = [str(i) for i in ids]
    return out


def settings_echo(settings: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if settings.get("strategy"):
        out["strategy"] = settings["strategy"].upper()
    for key in ("max_unacked", "ack_timeout", *LIFECYCLE_SETTINGS):
        if settings.get(key):
            out[key] = settings[key]
    return out


def settings_out(settings: QueueSettings) -> dict[str, Any]:
    out: dict[str, Any] = {"strategy": settings.strategy.name}
    if settings.max_unacked:
        out["max_unacked"] = settings.max_unacked
    if settings.ack_timeout:
        out["ack_timeout"] = settings.ack_timeout
    out.update(settings.lifecycle())
    return out


def lifecycle_of(settings: dict[str, Any]) -> dict[str, Any]:
    """The lifecycle settings a create or update request gives."""
    return {key: settings[key] for key in LIFECYCLE_SETTINGS if key in settings}


def _covers() -> Callable[[str], bool] | None:
    """The queue names the caller's key may see, when it is limited to patterns (None:
    every name)."""
    call = CURRENT_CALL.get(None)
    key = call.environ.get(KEY_ENVIRON) if call is not None else None
    return key.covers if key is not None and key.queues else None


def queue_info_out(info: QueueInfo) -> dict[str, Any]:
    settings = settings_out(info.settings)
    out = {"name": info.name, "type": info.type.value, "settings": settings,
           "enqueue_rps": info.enqueue_rps, "dequeue_rps": info.dequeue_rps,
           "ack_rps": info.ack_rps, "nack_rps": info.nack_rps, "ready": info.ready,
           "unacked": info.unacked, "total": info.total}
    if info.paused:
        out["paused"] = True
    if info.paused_groups:
        out["paused_groups"] = info.paused_groups
    dlq = info.settings.dead_letter_queue
    covers = _covers() if dlq else None
    if covers is not None and not covers(dlq):        # a name outside the key's patterns
        del settings["dead_letter_queue"]
        out["dead_letter_queue_hidden"] = True
    return out


def message_out(status: str, msg: Message, delivered: bool = False) -> dict[str, Any]:
    """A message as answered; ``delivered`` (dequeue, get): with its delivery count and the
    last error a nack or reject gave it, if any."""
    out: dict[str, Any] = {"status": status, "id": str(msg.id)}
    if msg.group:
        out["group"] = msg.group
    out["priority"] = msg.priority
    out["content"] = msg.content
    if msg.metadata:
        out["metadata"] = shown_metadata(msg.metadata, _covers()) \
            if DEAD_FROM in msg.metadata else msg.metadata
    if delivered:
        out["deliveries"] = msg.deliveries
        if msg.delivery:
            out["delivery"] = msg.delivery
        if msg.last_error:
            out["last_error"] = msg.last_error
        if msg.expires_at:
            out["expires_at"] = msg.expires_at
    return out


def _strategy(settings: dict[str, Any]) -> Strategy:
    name = settings.get("strategy")
    return Strategy[name.upper()] if name else Strategy.STRATEGY_UNSPECIFIED


class Api:
    """Route handlers; each returns the response body (bytes). The operator controls and the
    schedules have their own objects (``controls``, ``schedules``); a route names its handler
    by its path from here (``"controls.purge"``)."""

    def __init__(self, service: Service, membership: Membership, auth: Authorizer) -> None:
        self.svc = service
        self.members = membership
        self.auth = auth
        self.controls = ControlsApi(service)
        self.schedules = SchedulesApi(service)

    def create_queue(self) -> bytes:
        body = json_body("CreateQueueInputBody")
        check_queue_name(body["name"], new=True)
        self.auth.check_queue(CURRENT_CALL.get(), ROUTE_RULES["create-queue"], body["name"])
        settings = body.get("settings") or {}
        self._check_dead_letter_queue("create-queue", settings)
        existed = self.svc.create_queue(body["name"], body["type"], _strategy(settings),
                                        settings.get("max_unacked", 0),
                                        settings.get("ack_timeout", 0), lifecycle_of(settings))
        if existed:                   # the original's answer, with what is stored and a flag
            try:
                stored = queue_info_out(self.svc.queue_info(body["name"]))
            except QueueNotFound:     # deleted since: what was asked, still flagged
                stored = {"type": body["type"], "settings": settings_echo(settings)}
            return reply(200, {"status": "CREATED", "name": body["name"], "existed": True,
                                **{k: v for k, v in stored.items()
                                   if k in ("type", "settings", "dead_letter_queue_hidden")}})
        return reply(200, {"status": "CREATED", "name": body["name"], "type": body["type"],
                            "settings": settings_echo(settings)})

    def _check_dead_letter_queue(self, op_id: str, settings: dict[str, Any]) -> None:
        """Sending dead letters to a queue is writing to it: the caller's key must cover
        that queue as well."""
        if settings.get("dead_letter_queue"):
            self.auth.check_queue(CURRENT_CALL.get(), ROUTE_RULES[op_id],
                                  settings["dead_letter_queue"])

    def list_queues(self) -> bytes:
        key = self.auth.current(CURRENT_CALL.get())
        return reply(200, {"queues": [queue_info_out(q) for q in self.svc.list_queues()
                                       if key.covers(q.name)]})

    def queue_info(self, queue_name: str) -> bytes:
        return reply(200, queue_info_out(self.svc.queue_info(queue_name)))

    def update_queue(self, queue_name: str) -> bytes:
        settings = json_body("UpdateQueueInputBody")["settings"]
        self._check_dead_letter_queue("update-queue", settings)
        self.svc.update_queue(queue_name, _strategy(settings), settings.get("max_unacked", 0),
                              settings.get("ack_timeout", 0), lifecycle_of(settings))
        return reply(200, {"status": "UPDATED", "name": queue_name,
                            "settings": settings_echo(settings)})

    def delete_queue(self, queue_name: str) -> bytes:
        self.svc.delete_queue(queue_name, _covers())
        return reply(200, {"status": "DELETED"})

    def enqueue(self, queue_name: str) -> bytes:
        body = json_body("EnqueueInputBody")
        mid = enqueue_id(body.get("id"))
        group, metadata = body.get("group") or "", body.get("metadata") or {}
        stored = self.svc.enqueue(queue_name, mid, group, body["priority"], body["content"],
                                  metadata, body.get("dedup_key") or "", body.get("ttl") or 0,
                                  body.get("delay") or 0)
        echo = Message(stored.id, group, body["priority"], body["content"], metadata)
        out = message_out("ENQUEUED", echo)
        if stored.duplicate:
            out["duplicate"] = True              # seen within the dedup window: not stored
        return reply(200, out)

    def enqueue_batch(self, queue_name: str) -> bytes:
        """Several messages in one request and one replicated operation: all or none."""
        body = json_body("EnqueueBatchInputBody")
        items = []
        for n, m in enumerate(body["messages"]):
            mid = enqueue_id(m.get("id"), f"body.messages[{n}].id")
            items.append(EnqueueItem(queue_name, mid, m.get("group") or "", m["priority"],
                                     m["content"], m.get("metadata") or None,
                                     m.get("dedup_key") or "", m.get("ttl") or 0,
                                     m.get("delay") or 0))
        ids = self.svc.enqueue_batch(items)
        return reply(200, {"status": "ENQUEUED", "ids": [str(i) for i in ids]})

    def dequeue(self, queue_name: str) -> bytes:
        call = CURRENT_CALL.get()
        if call.method == "HEAD":               # HEAD is routed to GET: never dequeue
            call.set_header("Allow", "GET")
            raise HttpProblem(405, REASONS[405])
        if query_flag("browse"):                   # a listing, nothing taken
            return self.controls.browse(queue_name, message_out)
        ack = query_ack()
        count, wait = query_count(), query_wait()
        consumer = query_consumer()
        if count is None and wait is None:
            return reply(200, message_out("DEQUEUED", self.svc.dequeue(queue_name, ack,
                                                                        consumer), True))
        watch = ClientWatch(call.environ) if wait else contextlib.nullcontext()
        with watch as gone:
            taken = self.svc.take(queue_name, ack, count or 1, wait or 0.0, gone, consumer)
        if count is None:
            if not taken:
                raise error_for_result("dequeue", ResultCode.QUEUE_EMPTY, queue_name)
            return reply(200, message_out("DEQUEUED", taken[0], True))
        return reply(200, {"messages": [message_out("DEQUEUED", m, True) for m in taken]})

    def get(self, queue_name: str, id: str) -> bytes:
        return reply(200, message_out("GOT", self.svc.get(queue_name, path_id(id)), True))

    def delete(self, queue_name: str, id: str) -> bytes:
        self.svc.delete(queue_name, path_id(id))
        CURRENT_CALL.get().status = 204
        return b""

    def ack(self, queue_name: str, id: str) -> bytes:
        mid = path_id(id)
        body = settle_body()
        items = self._settle_items(body)
        ids = self.svc.ack(queue_name, mid, delivery_of(mid, body), items)
        return reply(200, _with_ids({"status": "ACKNOWLEDGED", "id": str(mid)}, items, ids))

    def _settle_items(self, body: dict[str, Any] | None, where: str = "") -> list[EnqueueItem]:
        """The messages a settle stores with it (``"enqueue"``): each target queue must be
        one the caller's key may produce to."""
        items: list[EnqueueItem] = []
        call = CURRENT_CALL.get()
        for n, m in enumerate((body or {}).get("enqueue") or []):
            self.auth.check_queue(call, ROUTE_RULES["enqueue"], m["queue"])
            mid = enqueue_id(m.get("id"), f"body.{where}enqueue[{n}].id")
            items.append(EnqueueItem(m["queue"], mid, m.get("group") or "", m["priority"],
                                     m["content"], m.get("metadata") or None,
                                     m.get("dedup_key") or "", m.get("ttl") or 0,
                                     m.get("delay") or 0))
        return items

    def nack(self, queue_name: str, id: str) -> bytes:
        mid = path_id(id)
        body = json_body("NackInputBody")               # {} at least (the original's rule)
        metadata = body.get("metadata")
        items = self._settle_items(body)
        priority, _, dead, refused, ids = self.svc.nack(
            queue_name, mid, body.get("priority") or 0, metadata, body.get("error") or "",
            body.get("delay") or 0, delivery_of(mid, body), items)
        out: dict[str, Any] = _with_ids({"status": "UNACKNOWLEDGED", "id": str(mid),
                                         "priority": priority}, items, ids)
        if metadata:
            out["metadata"] = metadata
        if dead:
            out["dead_lettered"] = True          # its deliveries were used up
        if refused:
            out["dead_letter_refused"] = refused  # ... but its dead-letter queue is full
        return reply(200, out)

    def reject(self, queue_name: str, id: str) -> bytes:
        """Dead-letter a delivered message now (reason ``rejected``)."""
        mid = path_id(id)
        body = json_body("RejectInputBody", required=False)
        items = self._settle_items(body)
        ids = self.svc.reject(queue_name, mid, body.get("error") or "", delivery_of(mid, body),
                              items, body.get("reason") or "rejected")
        return reply(200, _with_ids({"status": "REJECTED", "id": str(mid)}, items, ids))

    def redrive(self, queue_name: str) -> bytes:
        """Move dead-lettered messages back (to ``to``, or each to its x-dead-from)."""
        body = json_body("RedriveInputBody", required=False)
        if "ids" in body and "count" in body:
            raise HttpProblem(422, "validation failed", [{
                "message": "give ids or count, not both", "location": "body.count",
                "value": body["count"]}])
        to = body.get("to", "")
        call = CURRENT_CALL.get()
        if to:
            self.auth.check_queue(call, ROUTE_RULES["redrive"], to)
        elif self.auth.current(call).queues:
            raise PermissionDenied("a key limited to some queues must name the target queue "
                                   "('to')")
        ids = batch_ids(body["ids"]) if "ids" in body else None
        moved, failed = self.svc.redrive(queue_name, to, ids,
                                         body.get("count", rules.MAX_REDRIVE))
        return reply(200, {"moved": moved, "failed": [
            {"id": str(mid), "code": code, "detail": detail} for mid, code, detail in failed]})

    def ack_batch(self, queue_name: str) -> bytes:
        """Acknowledge up to 1000 messages in one replicated operation (each may store
        messages with its ack: ``{"id", "delivery", "enqueue"}``)."""
        raw = json_body("AckBatchInputBody")["ids"]
        ids, tokens = settle_ids(raw)
        per_id = [self._settle_items(item if isinstance(item, dict) else None, f"ids[{n}].")
                  for n, item in enumerate(raw)]
        if not any(per_id):
            return _settled("acked", ids, self.svc.ack_ids(queue_name, ids, tokens))
        if sum(map(len, per_id)) > schema.MAX_BATCH:
            raise HttpProblem(422, "validation failed", [{
                "message": f"expected at most {schema.MAX_BATCH} messages to enqueue in all",
                "location": "body.ids", "value": sum(map(len, per_id))}])
        failed, stored = self.svc.ack_ids_enqueue(queue_name, ids, tokens, per_id)
        out = _settled_out("acked", ids, failed)
        out["enqueued"] = {str(mid): [str(i) for i in got]
                           for mid, got in zip(ids, stored) if got}
        return reply(200, out)

    def nack_batch(self, queue_name: str) -> bytes:
        """Give up to 1000 messages back in one replicated operation."""
        body = json_body("NackBatchInputBody")
        ids, tokens = settle_ids(body["ids"])
        failed = self.svc.nack_ids(queue_name, ids, body.get("priority") or 0,
                                   body.get("metadata"), body.get("error") or "",
                                   body.get("delay") or 0, tokens)
        return _settled("nacked", ids, failed)

    def touch(self, queue_name: str, id: str) -> bytes:
        mid = path_id(id)
        self.svc.touch(queue_name, mid, delivery_of(mid, settle_body(items=False)))
        return reply(200, {"status": "TOUCHED", "id": str(mid)})

    def update_priority(self, queue_name: str, id: str) -> bytes:
        mid = path_id(id)
        priority = json_body("UpdatePriorityInputBody")["priority"]
        self.svc.update_priority(queue_name, mid, priority)
        return reply(200, {"status": "UPDATED", "id": str(mid), "priority": priority})

    def generate_ids(self) -> bytes:
        count = json_body("GenerateIdsInputBody")["number"]
        return reply(200, {"ids": [str(i) for i in self.svc.generate_ids(count)]})

    def backup(self) -> Any:
        since = int(json_body("BackupInputBody", required=False).get("since", 0))
        if self._relays():
            return self._relay("/db/backup", json.dumps({"since": since}).encode(),
                               "application/json", 600.0)
        last, chunks = self.svc.backup(since)
        response = CURRENT_CALL.get()
        response.status = 200
        response.content_type = "application/octet-stream"
        response.set_header("X-Last-Version", str(last))
        kind = "full" if since == 0 else f"incremental-{since}"
        response.set_header("Content-Disposition",
                            f'attachment; filename="doq-{kind}-to-{last}.bak"')
        return chunks

    def restore(self) -> Any:
        call = CURRENT_CALL.get()
        ctype = call.request_content_type.split(";")[0].strip()
        if ctype == "multipart/form-data":
            try:
                uploads = call.request.files.getall("file")
            except bottle.HTTPError as exc:          # bottle's multipart limits
                raise HttpProblem(400, "validation failed", [{
                    "message": f"cannot read the multipart body: {exc.body}",
                    "location": "body"}]) from None
            files = [upload.file for upload in uploads]
            if not files:
                raise HttpProblem(422, "validation failed", [{
                    "message": "expected the backup in the multipart file field 'file'",
                    "location": "body.file"}])
        elif ctype in ("application/octet-stream", ""):
            files = [spool_body()]
        else:
            raise HttpProblem(415, "validation failed", [{
                "message": f"unsupported content type {ctype!r}: send the backup as "
                           "multipart/form-data (field 'file') or application/octet-stream",
                "location": "header.Content-Type", "value": ctype}])
        try:
            if self._relays():
                return self._relay("/db/restore", _concatenated(files),
                                   "application/octet-stream", 3600.0,
                                   {"Content-Length": str(sum(_size(f) for f in files))})
            result = self.svc.restore(files)
        finally:
            for f in files:
                f.close()
        return reply(200, {"status": "SUCCEDED", **result})

    def _relays(self) -> bool:
        """Whether this backup or restore goes on to the leader: this node follows, and the
        request did not come relayed (a relayed one that finds no leader here is refused)."""
        if self.svc.proposer.is_leader:
            return False
        if CURRENT_CALL.get().environ.get(_RELAYED_ENVIRON):
            raise NotLeader("relayed to a node that does not lead (the leader changed): retry")
        return True

    def _relay(self, path: str, payload: bytes | Iterator[bytes], content_type: str,
               timeout: float, headers: dict[str, str] | None = None) -> Any:
        """Send this request on to the leader (its peer address) and stream its answer back,
        status and headers included: a caller that reaches only this node's published
        address gets the leader's backup or restore."""
        conn, response = self.members.open_to_leader(
            "POST", path, payload, content_type, {**_credentials(), **(headers or {})},
            timeout)
        call = CURRENT_CALL.get()
        call.status = response.status
        call.content_type = response.getheader("Content-Type", "application/octet-stream")
        for name in ("X-Last-Version", "Content-Disposition", "WWW-Authenticate"):
            value = response.getheader(name)
            if value is not None:
                call.set_header(name, value)
        if response.status != 200 or path != "/db/backup":
            try:
                return response.read()
            finally:
                conn.close()
        return _streamed(conn, response)

    def internal_status(self) -> bytes:
        return reply(200, self.svc.status())

    def internal_state(self) -> bytes:
        return reply(200, self.svc.state_digest())

    def servers(self) -> bytes:
        local = query_flag("local")
        servers = self.members.local_servers() if local else \
            self.members.servers(_credentials())
        return reply(200, {"servers": [
            {"id": s.id, "addr": s.addr, "leader_addr": s.leader_addr, "is_leader": s.is_leader,
             "suffrage": s.suffrage, "http_addr": s.http_addr, "grpc_addr": s.grpc_addr,
             "lag": s.lag, "connected": s.connected, "peer_http_addr": s.peer_http_addr,
             "peer_grpc_addr": s.peer_grpc_addr} for s in servers],
            "cluster_id": self.svc.fsm.cluster_id})

    def join(self) -> bytes:
        body = json_body("JoinInputBody")
        self.members.check_join(body["id"], body["addr"], **{
            k: body[k] for k in ("http_addr", "grpc_addr", "client_http_addr",
                                 "client_grpc_addr") if k in body})
        if self.members.leader_http() is not None:       # a follower: the leader decides
            return relay(*self.members.forward("/API/v1/cluster/join", body, _credentials()))
        self.members.join(body["id"], body["addr"], body.get("http_addr", ""),
                          body.get("grpc_addr", ""), body.get("client_http_addr", ""),
                          body.get("client_grpc_addr", ""))
        return reply(200, {"id": body["id"], "addr": body["addr"]})

    def leave(self) -> bytes:
        body = json_body("LeaveInputBody")
        if self.members.leader_http() is not None:
            return relay(*self.members.forward("/API/v1/cluster/leave", body, _credentials()))
        self.members.leave(body["id"])
        return reply(200, {"id": body["id"]})


ROUTES: list[tuple[str, str, str, str]] = [     # method, path, op id, handler
    ("POST", "/API/v1/ids", "generate-id", "generate_ids"),
    ("POST", "/db/backup", "db-backup", "backup"),
    ("POST", "/db/restore", "db-restore", "restore"),
    ("GET", "/API/v1/cluster/servers", "cluster-servers", "servers"),
    ("POST", "/API/v1/cluster/join", "cluster-join", "join"),
    ("POST", "/API/v1/cluster/leave", "cluster-leave", "leave"),
    ("POST", "/API/v1/queues", "create-queue", "create_queue"),
    ("GET", "/API/v1/queues", "queues", "list_queues"),
    ("GET", "/API/v1/queues/<queue_name>", "queue-info", "queue_info"),
    ("PUT", "/API/v1/queues/<queue_name>", "update-queue", "update_queue"),
    ("DELETE", "/API/v1/queues/<queue_name>", "delete-queue", "delete_queue"),
    ("POST", "/API/v1/queues/<queue_name>/messages", "enqueue", "enqueue"),
    ("POST", "/API/v1/queues/<queue_name>/messages/batch", "enqueue-batch", "enqueue_batch"),
    ("GET", "/API/v1/queues/<queue_name>/messages", "dequeue", "dequeue"),
    ("POST", "/API/v1/queues/<queue_name>/messages/ack", "ack-batch", "ack_batch"),
    ("POST", "/API/v1/queues/<queue_name>/messages/nack", "nack-batch", "nack_batch"),
    ("GET", "/API/v1/queues/<queue_name>/messages/<id>", "get", "get"),
    ("DELETE", "/API/v1/queues/<queue_name>/messages/<id>", "delete", "delete"),
    ("POST", "/API/v1/queues/<queue_name>/messages/<id>/ack", "ack", "ack"),
    ("POST", "/API/v1/queues/<queue_name>/messages/<id>/nack", "nack", "nack"),
    ("POST", "/API/v1/queues/<queue_name>/messages/<id>/touch", "touch", "touch"),
    ("POST", "/API/v1/queues/<queue_name>/messages/<id>/reject", "reject", "reject"),
    ("POST", "/API/v1/queues/<queue_name>/redrive", "redrive", "redrive"),
    ("PUT", "/API/v1/queues/<queue_name>/messages/<id>/priority", "update-priority",
     "update_priority"),
    *CONTROL_ROUTES,
    *SCHEDULE_ROUTES,
    # diagnostics (not part of the DOQ wire contract)
    ("GET", "/internal/status", "internal-status", "internal_status"),
    ("GET", "/internal/state", "internal-state", "internal_state"),
]


_RELAYED_ENVIRON = "HTTP_" + RELAYED_HEADER.upper().replace("-", "_")


def _concatenated(files: list[Any]) -> Iterator[bytes]:
    """The spooled upload files, one after another, in blocks."""
    for f in files:
        f.seek(0)
        while block := f.read(1 << 20):
            yield block


def _size(f: Any) -> int:
    f.seek(0, 2)
    size = int(f.tell())
    f.seek(0)
    return size


def _streamed(conn: Any, response: Any) -> Iterator[bytes]:
    """A relayed answer in blocks; the connection is closed once it is read (or dropped)."""
    try:
        while block := response.read(1 << 20):
            yield block
    finally:
        conn.close()


def _credentials() -> dict[str, str]:
    """The caller's Authorization header, passed on when a request is forwarded to the leader
    (which checks it again); nodes sign forwarded requests with the cluster secret too."""
    header = CURRENT_CALL.get().environ.get("HTTP_AUTHORIZATION")
    return {"Authorization": header} if header else {}

