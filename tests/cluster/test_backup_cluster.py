"""Backups and restores against real 3-node clusters, over HTTP and through the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.harness import DOQ, Cluster, Http, Response, message_body

pytestmark = pytest.mark.timeout(300)


def multipart(*files: bytes, field: str = "file") -> tuple[bytes, dict[str, str]]:
    boundary = uuid.uuid4().hex
    body = b""
    for n, data in enumerate(files):
        body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; "
                 f"filename=\"b{n}.bak\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                 ).encode() + data + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def upload(http: Http, *files: bytes) -> Response:
    body, headers = multipart(*files)
    return http.request("POST", "/db/restore", raw=body, headers=headers)


def take(http: Http, since: int | None = None) -> tuple[bytes, int]:
    r = http.post("/db/backup", None if since is None else {"since": since})
    assert r.status == 200, r.body
    assert r.headers["content-type"] == "application/octet-stream"
    return r.body, int(r.headers["x-last-version"])


def queue_digests(cluster: Cluster) -> set[str]:
    cluster.assert_replicas_identical()
    return {s["queue_digest"] for s in cluster.states()}


def listing(http: Http) -> list[dict[str, Any]]:
    queues = http.get("/API/v1/queues").json()["queues"]
    keep = ("name", "type", "settings", "ready", "unacked", "total")
    return sorted(({k: q.get(k) for k in keep} for q in queues), key=lambda q: q["name"])


def messages(http: Http, ids: dict[str, list[int]]) -> dict[tuple[str, int], Any]:
    out = {}
    for q, mids in ids.items():
        for mid in mids:
            r = http.get(f"/API/v1/queues/{q}/messages/{mid}")
            out[(q, mid)] = r.json() if r.status == 200 else r.status
    return out


def enqueue(http: Http, q: str, content: str, priority: int = 5, group: str = "",
            metadata: dict[str, str] | None = None) -> int:
    r = http.post(f"/API/v1/queues/{q}/messages", message_body(content, priority, group,
                                                               metadata))
    assert r.status == 200, r.body
    return int(r.json()["id"])


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Cluster]]:
    src = Cluster(str(tmp_path_factory.mktemp("source")))
    dst = Cluster(str(tmp_path_factory.mktemp("target")))
    try:
        src.start()
        dst.start()
        yield src, dst
    finally:
        src.stop()
        dst.stop()


def doq(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, DOQ, *args], capture_output=True, text=True,
                          timeout=timeout)


def test_full_and_two_incrementals_rebuild_the_source(clusters: tuple[Cluster, Cluster],
                                                      tmp_path: Path) -> None:
    src, dst = clusters
    s = src.leader().http()
    for body in ({"name": "d", "type": "delayed"},
                 {"name": "rr", "type": "fair",
                  "settings": {"strategy": "round_robin", "max_unacked": 2,
                               "ack_timeout": 3600}},
                 {"name": "w", "type": "fair", "settings": {"strategy": "weighted"}},
                 {"name": "gone", "type": "delayed"}):
        assert s.post("/API/v1/queues", body).status == 200
    ids: dict[str, list[int]] = {"d": [], "rr": [], "w": [], "gone": [], "new": []}
    for i in range(40):
        ids["d"].append(enqueue(s, "d", f"d{i}", i % 5, metadata={"n": str(i)}))
        ids["rr"].append(enqueue(s, "rr", f"r{i}", 3, f"g{i % 4}"))
        ids["w"].append(enqueue(s, "w", f"w{i}", 3, f"t{i % 2}.u{i % 3}"))
    ids["gone"].append(enqueue(s, "gone", "bye"))
    s.get("/API/v1/queues/rr/messages?ack=false")                  # in flight, 1 h deadline
    s.get("/API/v1/queues/d/messages?ack=true")
    follower = src.followers()[0].http()
    relayed = follower.post("/db/backup", {"since": 0})            # relayed to the leader
    assert s.post("/db/backup", {"since": -1}).status == 422

    full, v0 = take(s)                                             # no body: since 0
    assert relayed.status == 200, relayed.body[:300]
    assert relayed.headers["content-type"] == "application/octet-stream"
    assert int(relayed.headers["x-last-version"]) == v0 and len(relayed.body) == len(full)
    # more changes: enqueue, ack, nack, delete message, delete queue, create queue
    mid = int(s.get("/API/v1/queues/d/messages?ack=false").json()["id"])
    assert s.post(f"/API/v1/queues/d/messages/{mid}/ack").status == 200
    assert s.delete(f"/API/v1/queues/w/messages/{ids['w'][3]}").status == 204
    assert s.delete("/API/v1/queues/gone").status == 200
    assert s.post("/API/v1/queues", {"name": "new", "type": "delayed"}).status == 200
    ids["new"].append(enqueue(s, "new", "fresh"))
    inc1, v1 = take(s, v0 + 1)
    rr = int(s.get("/API/v1/queues/rr/messages?ack=false").json()["id"])
    assert s.post(f"/API/v1/queues/rr/messages/{rr}/nack", {"priority": 9}).status == 200
    assert s.put(f"/API/v1/queues/d/messages/{ids['d'][7]}/priority",
                 {"priority": 77}).status == 200
    ids["d"].append(enqueue(s, "d", "late"))
    inc2, v2 = take(s, v1 + 1)
    assert v0 < v1 < v2

    d = dst.leader().http()
    refused = dst.followers()[0].http().post("/db/restore", raw=b"not a backup", headers={
        "Content-Type": "application/octet-stream"})                # relayed: the leader's no
    assert refused.status == 400 and "backup" in refused.json()["detail"], refused.body
    assert upload(d, inc1).status == 409                           # nothing to follow yet
    for data in (full, inc1, inc2):
        r = upload(d, data)
        assert r.status == 200, r.body
        assert r.json()["status"] == "SUCCEDED"
    assert queue_digests(dst) == queue_digests(src)
    assert len(queue_digests(dst)) == 1
    assert listing(d) == listing(s)
    assert messages(d, ids) == messages(s, ids)
    assert upload(d, inc1).status == 409                           # out of order

    # a damaged or truncated file changes nothing
    before = queue_digests(dst)
    for bad in (full[:len(full) // 2], full[:100] + b"\x00" + full[101:], b"garbage"):
        r = upload(d, bad)
        assert r.status == 400, r.body
        assert r.json()["detail"] == "invalid backup file"
    assert upload(d, full, inc2).status == 409                     # a gap in one request
    r = d.post("/db/restore", raw=b"x", headers={"Content-Type": "text/plain"})
    assert r.status == 415
    body, headers = multipart(full, field="other")
    assert d.request("POST", "/db/restore", raw=body, headers=headers).status == 422
    assert queue_digests(dst) == before

    # the whole chain in one request replaces everything again (here: the same state)
    s.post("/API/v1/queues", {"name": "later", "type": "delayed"})
    r = upload(d, full, inc1, inc2)
    assert r.status == 200 and r.json()["backups"] == 3
    assert queue_digests(dst) == before

    # and the restored cluster keeps working: deliveries continue where the source was
    got = d.get("/API/v1/queues/d/messages?ack=true").json()
    assert got == s.get("/API/v1/queues/d/messages?ack=true").json()


def test_cli_backup_restore_and_offline_reads(clusters: tuple[Cluster, Cluster],
                                              tmp_path: Path) -> None:
    src, dst = clusters
    s = src.leader().http()
    s.post("/API/v1/queues", {"name": "cli", "type": "fair",
                              "settings": {"strategy": "weighted"}})
    first = [enqueue(s, "cli", f"c{i}", 2, "g", {"k": "v"}) for i in range(5)]
    urls = [f"--url=http://127.0.0.1:{n.http_port}" for n in src.nodes]
    full = tmp_path / "full.bak"
    r = doq("backup", *urls, "-o", str(full))
    assert r.returncode == 0, r.stderr
    since = int(r.stdout)
    assert "wrote full backup" in r.stderr and full.exists()
    assert not (tmp_path / "full.bak.part").exists()
    more = [enqueue(s, "cli", f"m{i}", 1, "h") for i in range(3)]
    inc = tmp_path / "inc.bak"
    r = doq("backup", *urls, "-o", str(inc), "--since", str(since))
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) > since

    durls = [f"--url=http://127.0.0.1:{n.http_port}" for n in reversed(dst.nodes)]
    r = doq("restore", *durls, "-f", str(full), "-i", str(inc))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["backups"] == 2
    assert queue_digests(dst) == queue_digests(src)
    d = dst.leader().http()
    assert messages(d, {"cli": first + more}) == messages(s, {"cli": first + more})

    # scripts can rely on the exit codes
    bad = tmp_path / "bad.bak"
    bad.write_bytes(full.read_bytes()[:-5])
    r = doq("restore", *durls, "-f", str(bad))
    assert r.returncode == 1 and "truncated" in r.stderr
    r = doq("restore", *durls, "-i", str(full))
    assert r.returncode == 1 and "full backup" in r.stderr
    r = doq("restore", *durls, "-f", str(full), "-i", f"{inc},{inc}")
    assert r.returncode == 1 and "in order" in r.stderr
    r = doq("backup", "--url=http://127.0.0.1:9", "-o", str(tmp_path / "x.bak"))
    assert r.returncode == 3
    r = doq("backup", *urls, "-o", str(tmp_path / "x.bak"), "--since", "999999999")
    assert r.returncode == 1 and "after the newest version" in r.stderr
    r = doq("backup", *urls)
    assert r.returncode == 2
    assert doq("restore", "--help").returncode == 0

    # offline reads of a stopped node
    node = dst.nodes[0]
    node.stop()
    flags = [f"--storage.data_dir={node.data_dir}", f"--cluster.node_id={node.node_id}"]
    r = doq("get", "queues", *flags)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "" and lines[1].startswith("Found ")
    assert "cli fair WEIGHTED" in lines and "d delayed " in lines
    r = doq("get", "messages", *flags, "-q", "cli", "-o", "jsonl", "-n", "3")
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in r.stdout.splitlines()]      # the API's key names
    assert [m["id"] for m in got] == [str(i) for i in sorted(first + more)[:3]]
    assert set(got[0]) == {"id", "group", "priority", "content", "metadata"}
    assert got[0]["metadata"] == {"k": "v"}
    r = doq("get", "messages", *flags, "-q", "cli", "-o", "json", "-n", "1")
    assert set(json.loads(r.stdout)[0]) == {"ID", "Group", "Priority", "Content", "Metadata"}
    r = doq("get", "messages", *flags, "-q", "cli", str(more[0]))
    assert f"ID: {more[0]}" in r.stdout and "Content: m0" in r.stdout
    assert doq("get", "messages", *flags).stdout.strip() == "Queue name is required"
    assert doq("get", "messages", *flags, "-q", "cli", "-o", "xml").stdout.strip() == \
        "Unknown format: xml"
    node.start()
    dst.wait_ready()
    assert os.path.exists(node.log_path)
