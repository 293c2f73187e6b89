"""Replicated operations stay readable: a journal and a snapshot written by an older DOQ
(tests/data/replay-v1, made by tests/probes/replay_fixture.py) rebuild the same queues."""
from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest

from tests.harness import REPO, NodeProc, free_ports, wait_until

FIXTURES = os.path.join(REPO, "tests", "data", "replay-v1")


@pytest.mark.parametrize("kind", ["journal", "snapshot"])
def test_an_old_journal_and_snapshot_rebuild_the_same_queues(tmp_path: Any, kind: str) -> None:
    """The node's data without its store: the node rebuilds the store from what Raft kept
    (every operation in the journal; or a snapshot and the journal's tail), and ends with
    the queue state the old code had, byte for byte (the store's queue digest)."""
    source = os.path.join(FIXTURES, kind)
    with open(os.path.join(source, "expected.json"), encoding="utf-8") as f:
        expected = json.load(f)
    node_id = expected["node_id"]
    shutil.copytree(os.path.join(source, node_id), os.path.join(tmp_path, node_id))
    # the same Raft address: it is part of the replicated membership
    node = NodeProc(node_id, free_ports(1)[0], expected["raft_port"], str(tmp_path), [],
                    host=expected["host"])
    node.start()
    try:
        wait_until(node.ready, 40, describe=lambda: node.tail(40))
        log = node.tail(200)
        assert ("installing snapshot" in log) == (kind == "snapshot"), log
        fields = ("name", "type", "settings", "ready", "unacked", "total")
        queues = [{k: q[k] for k in fields}
                  for q in node.http().get("/API/v1/queues").json()["queues"]]
        assert queues == expected["queues"]
        assert node.state()["queue_digest"] == expected["queue_digest"]
        assert "Traceback" not in node.tail(400)
    finally:
        node.stop()
