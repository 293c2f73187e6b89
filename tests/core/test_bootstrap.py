"""Which partners a node starts Raft with, and whether it still has to join (no network)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from doq_lib.cluster import PEERS_FILE, bootstrap_peers, mark_joined
from doq_lib.config import load_config


def _cfg(tmp_path: Path, **flags: str):  # type: ignore[no-untyped-def]
    base = {"raft.address": "127.0.0.1:9000", "storage.data_dir": str(tmp_path)}
    return load_config({**base, **flags}, {}, None, str(tmp_path))


def test_a_static_member_records_its_partners_once(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, **{"cluster.peers": "127.0.0.1:9000,127.0.0.1:9001,127.0.0.1:9002"})
    peers, joining = bootstrap_peers(cfg, str(tmp_path / "raft"))
    assert peers == ["127.0.0.1:9001", "127.0.0.1:9002"] and not joining
    again = _cfg(tmp_path, **{"cluster.peers": "127.0.0.1:9002,127.0.0.1:9001,127.0.0.1:9000"})
    assert bootstrap_peers(again, str(tmp_path / "raft")) == (peers, False), \
        "a restart keeps the partners Raft started with (in any order)"
    changed = _cfg(tmp_path, **{"cluster.peers": "127.0.0.1:9000,127.0.0.1:9005"})
    with pytest.raises(RuntimeError, match="a second cluster") as refused:
        bootstrap_peers(changed, str(tmp_path / "raft"))
    assert "start it with the same --cluster.peers" in str(refused.value)


def test_a_single_nodes_data_is_not_reused_for_a_cluster(tmp_path: Path) -> None:
    """`make run` then the three-node section made two clusters. A record from
    before the check (no started_by) of a single node is refused too."""
    raft_dir = tmp_path / "raft"
    assert bootstrap_peers(_cfg(tmp_path), str(raft_dir)) == ([], False)
    three = _cfg(tmp_path, **{"cluster.peers": "127.0.0.1:9000,127.0.0.1:9001,127.0.0.1:9002"})
    with pytest.raises(RuntimeError, match="no partners \\(a single-node cluster\\)"):
        bootstrap_peers(three, str(raft_dir))
    (raft_dir / PEERS_FILE).write_text(json.dumps({"peers": [], "joined": True}))
    with pytest.raises(RuntimeError, match="a second cluster"):
        bootstrap_peers(three, str(raft_dir))


def test_an_unfinished_join_is_retried_at_the_next_start(tmp_path: Path) -> None:
    raft_dir = tmp_path / "raft"
    raft_dir.mkdir()
    (raft_dir / PEERS_FILE).write_text(json.dumps({"peers": ["127.0.0.1:9001"],
                                                   "joined": False}))
    joiner = _cfg(tmp_path, **{"cluster.join_addr": "127.0.0.1:8001"})
    assert bootstrap_peers(joiner, str(raft_dir)) == (["127.0.0.1:9001"], True)
    with pytest.raises(RuntimeError, match="never finished joining"):
        bootstrap_peers(_cfg(tmp_path), str(raft_dir))
    mark_joined(str(raft_dir))
    assert bootstrap_peers(_cfg(tmp_path), str(raft_dir)) == (["127.0.0.1:9001"], False)
    assert not os.path.exists(raft_dir / (PEERS_FILE + ".tmp"))
