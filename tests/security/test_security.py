"""The attacks a security review found, each a regression test against real nodes, each
refused with the queue state unchanged (digest before and after); and request hygiene.

1. Code execution through the Raft port: tests/security/test_raft_security.py.
2. Anonymous wipe by restore: below, without keys (from a non-loopback client, in a private
   network namespace) and with keys.
3. Anonymous, permanent cluster break by join: tests/cluster/test_membership.py
   (``test_a_join_of_an_address_that_is_not_a_doq_node_changes_nothing``), and below from a
   non-loopback client.
4. A forged backup that breaks id generation or stores orphans: below.
5. No authentication, JSON parsed without a Content-Type, cross-site posts: below and
   tests/security/test_auth.py; TLS: tests/security/test_tls.py.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.core.test_backup import _message_record, _queue_record, forge
from tests.harness import REPO, Cluster, Http, NodeProc, add_key, running

PROBE = os.path.join(REPO, "tests", "probes", "remote_probe.py")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with running(str(tmp_path_factory.mktemp("sec")),
                 flags={"http.cors_origins": "https://console.example"}) as c:
        yield c.nodes[0]


def _restore(http: Http, data: bytes) -> Any:
    return http.request("POST", "/db/restore", raw=data,
                        headers={"Content-Type": "application/octet-stream"})


def test_without_keys_restore_join_leave_and_internal_are_for_loopback_clients_only(
        tmp_path: Path) -> None:
    for tool in ("unshare", "ip"):
        assert shutil.which(tool), f"{tool} is needed (make test installs it)"
    done = subprocess.run(["unshare", "--net", "--", sys.executable, PROBE, str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (status, code, message) in out["remote_refused"].items():
        assert status == 403 and code == "permission_denied", (name, status, message)
        assert "only from loopback clients" in message
    assert out["digest_unchanged"], "a refused request changed the queue state"
    # The API itself stays what the seed describes: open, curl quick start unchanged.
    assert (out["remote_create"], out["remote_enqueue"], out["remote_backup"]) == (200, 200, 200)
    assert (out["local_status"], out["local_restore"]) == (200, 200)
    assert out["warning_logged"]


def test_with_keys_an_anonymous_restore_is_refused_and_changes_nothing(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("wipe")
    keys = root / "keys.yaml"
    admin = add_key(keys, "ops", "admin")
    c = Cluster(str(root), size=1, flags={"auth.keys_file": str(keys)})
    c.nodes[0].admin_key = admin
    c.start()
    try:
        node = c.nodes[0]
        http = node.http()
        auth = {"Authorization": f"Bearer {admin}"}
        assert http.post("/API/v1/queues", {"name": "kept", "type": "delayed"},
                         headers=auth).status == 200
        before = node.state()["queue_digest"]
        empty = forge({"last_version": 1, "last_id": 1, "next_qid": 1}, [])
        r = _restore(http, empty)
        assert r.status == 401 and r.json()["code"] == "unauthenticated"
        assert http.post("/db/backup").status == 401
        assert node.state()["queue_digest"] == before
        with open(node.log_path, encoding="utf-8") as f:
            log = f.read()
        assert re.search(r" INFO +doq_lib\.server: API keys from \S+keys\.yaml: 1 key\n", log), \
            "the keys line is INFO and singular for one key"
    finally:
        c.stop()


@pytest.mark.parametrize(("header", "records", "message"), [
    ({"last_id": 2 ** 64 - 1}, [], "last_id is out of range"),
    ({"next_qid": 2 ** 63}, [], "next_qid is out of range"),
    ({}, [_message_record(7, 1)], "belongs to no queue"),
    ({}, [_queue_record("q", 1), _message_record(1, 5, b"\x00\x01")], "cannot be read"),
], ids=["huge-last-id", "huge-next-qid", "orphan-message", "undecodable-message"])
def test_a_forged_backup_is_refused_and_ids_keep_working(
        node: NodeProc, header: dict[str, Any], records: list[Any], message: str) -> None:
    http = node.http()
    http.post("/API/v1/queues", {"name": "ids", "type": "delayed"})
    before = node.state()["queue_digest"]
    r = _restore(http, forge(header, records))
    assert r.status == 400, r.body
    assert r.json()["detail"] == "invalid backup file"
    assert message in r.json()["errors"][0]["message"]
    assert node.state()["queue_digest"] == before
    enqueued = http.post("/API/v1/queues/ids/messages", {"content": "x", "priority": 1})
    assert enqueued.status == 200 and 0 < int(enqueued.json()["id"]) < 2 ** 63


def test_a_cross_site_post_is_refused(node: NodeProc) -> None:
    http = node.http()
    before = node.state()["queue_digest"]
    for origin in ("http://evil.example", "null", "http://127.0.0.1:1"):
        r = http.post("/API/v1/queues", {"name": "csrf", "type": "delayed"},
                      headers={"Origin": origin})
        assert r.status == 403 and r.json()["code"] == "permission_denied", origin
        assert "access-control-allow-origin" not in r.headers
    assert node.state()["queue_digest"] == before
    same = f"http://127.0.0.1:{node.http_port}"
    r = http.post("/API/v1/queues", {"name": "same-site", "type": "delayed"},
                  headers={"Origin": same})
    assert r.status == 200, r.body


def test_cors_headers_only_for_configured_origins(node: NodeProc) -> None:
    http = node.http()
    r = http.get("/API/v1/queues", headers={"Origin": "https://other.example"})
    assert r.status == 200 and not any(h.startswith("access-control-") for h in r.headers)
    r = http.get("/API/v1/queues", headers={"Origin": "https://console.example"})
    assert r.headers["access-control-allow-origin"] == "https://console.example"
    pre = http.request("OPTIONS", "/API/v1/queues", headers={
        "Origin": "https://console.example", "Access-Control-Request-Method": "POST"})
    assert pre.status == 204 and "Authorization" in pre.headers["access-control-allow-headers"]
    r = http.post("/API/v1/queues", {"name": "from-console", "type": "delayed"},
                  headers={"Origin": "https://console.example"})
    assert r.status == 200


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"NOT A REQUEST\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nBad Header Line\r\n\r\n", 400),
    (b"POST /API/v1/queues HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
     b"Content-Type: application/json\r\n\r\nzz\r\n", 400),
], ids=["uri-too-long", "request-line", "header-line", "bad-chunk"])
def test_the_servers_own_errors_have_problem_bodies(node: NodeProc, request_bytes: bytes,
                                                    status: int) -> None:
    answer = _raw(node.http_port, request_bytes)
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status}".encode()), head[:200]
    assert b"application/problem+json" in head.lower()
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    problem = json.loads(rest[:length])                 # the first answer (others may follow)
    assert problem["status"] == status and problem["errors"][0]["message"]


def test_bottles_own_403_is_a_problem(node: NodeProc) -> None:
    r = node.http().get("/assets/..%2f..%2fREADME.md")
    assert r.status in (403, 404)
    assert r.headers["content-type"] == "application/problem+json"
