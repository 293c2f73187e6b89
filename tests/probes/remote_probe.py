"""A node reached from a non-loopback address, inside a private network namespace.

Run by tests/security/test_security.py as ``unshare --net -- python remote_probe.py DIR``: the
namespace's loopback device gets 10.77.0.1 as well, the node listens on every interface, and
requests made from 10.77.0.1 arrive from a non-loopback client. Prints one JSON object.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.core.test_backup import forge  # noqa: E402
from tests.harness import Cluster, Http  # noqa: E402

REMOTE = "10.77.0.1"


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=20)


def main() -> None:
    root = sys.argv[1]
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "addr", "add", f"{REMOTE}/32", "dev", "lo")
    c = Cluster(root, size=1)
    node = c.nodes[0]
    node.flags["http.host"] = "0.0.0.0"
    c.start()
    out: dict[str, Any] = {}
    try:
        local = node.http()
        remote = Http(node.http_port, host=REMOTE, source=REMOTE)
        assert local.post("/API/v1/queues", {"name": "kept", "type": "delayed"}).status == 200
        assert local.post("/API/v1/queues/kept/messages",
                          {"content": "keep me", "priority": 1}).status == 200
        before = node.state()["queue_digest"]
        empty = forge({"last_version": 1, "last_id": 1, "next_qid": 1}, [])
        attempts = {
            "restore": remote.request("POST", "/db/restore", raw=empty,
                                      headers={"Content-Type": "application/octet-stream"}),
            "join": remote.post("/API/v1/cluster/join", {"id": "evil", "addr": "127.0.0.1:1"}),
            "leave": remote.post("/API/v1/cluster/leave", {"id": "node-0"}),
            "internal-status": remote.get("/internal/status"),
            "internal-state": remote.get("/internal/state"),
        }
        out["remote_refused"] = {k: [r.status, r.json().get("code"),
                                     r.json()["errors"][0]["message"]]
                                 for k, r in attempts.items()}
        out["digest_unchanged"] = node.state()["queue_digest"] == before
        out["remote_create"] = remote.post("/API/v1/queues",
                                           {"name": "open", "type": "delayed"}).status
        out["remote_enqueue"] = remote.post("/API/v1/queues/open/messages",
                                            {"content": "hi", "priority": 1}).status
        out["remote_backup"] = remote.post("/db/backup").status
        out["local_status"] = local.get("/internal/status").status
        out["local_restore"] = local.request(
            "POST", "/db/restore", raw=empty,
            headers={"Content-Type": "application/octet-stream"}).status
        out["warning_logged"] = "unauthenticated" in node.tail(50)
    finally:
        c.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
