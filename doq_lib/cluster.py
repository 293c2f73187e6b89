"""Cluster membership (L4): join, leave, the servers list, member identities.

Membership changes are PySyncObj configuration entries, one at a time, made by the leader.
Alongside them every member's identity (node id, Raft / HTTP / gRPC addresses) is replicated
through the state machine (``MEMBER_INFO``), so any node can name every member and reach the
leader's HTTP address.

A new node joins without ever forming a cluster of its own: it asks a member for the current
configuration, starts Raft with those members as partners (they refuse its connections until
the leader adds it, so it can neither win nor disturb an election), then asks the leader to add
it. A restarting node never joins again: the Raft log (or the snapshot) holds its
configuration, replayed on top of the partner list it first started with
(:func:`bootstrap_peers`).
"""
from __future__ import annotations

import functools
import http.client
import json
import logging
import os
import ssl
import time
from typing import Any, Callable, Iterable

import gevent
import gevent.event

from doq_lib import commands as C
from doq_lib.client.transport import Transport
from doq_lib.config import Config, split_host_port
from doq_lib.errors import (
    Conflict,
    DoqError,
    InvalidArgument,
    MemberNotFound,
    PeerUnverified,
    Unavailable,
)
from doq_lib.fsm import StateMachine
from doq_lib.models import MemberInfo, ServerInfo
from doq_lib.raft import wire
from doq_lib.raft.net import source_host
from doq_lib.raft.node import RaftNode
from doq_lib.raft.proposer import FAIL_TEXT, RaftError
from doq_lib.secret import ClusterSecret
from doq_lib.service import Service

log = logging.getLogger(__name__)
PEERS_FILE = "peers.json"
JOIN_ROUNDS, JOIN_PAUSE = 30, 2.0
#: Marks a request a follower relays to the leader: a node that gets one and does not lead
#: refuses it (400 not_leader) instead of relaying it again.
RELAYED_HEADER = "X-DOQ-Relayed"
LEADERLESS = 10.0          # seconds without a leader before a node asks if it was removed


# -- start-up: which partners, joining ------------------------------------------------------
def bootstrap_peers(cfg: Config, raft_dir: str, cluster_id: str = "",
                    ) -> tuple[list[str], bool]:
    """(partner Raft addresses to start with, whether this node must join a running cluster).

    The first start decides and records it; later starts reuse the record, because Raft replays
    every configuration change on top of the partners it started with. A join that has not
    succeeded yet is retried at the next start (:func:`mark_joined` records success).

    A node whose data was made by a cluster started with other partners than its
    ``--cluster.peers`` now (a single node's ``./data`` reused for a three-node cluster, a
    data folder of another cluster) refuses to start, saying what to do: using it would make
    a second cluster beside the one its partners form. So does a node that would
    join a cluster other than the one its data belongs to (``cluster_id``: its store's).
    """
    _peers.source = source_host(cfg.raft.bind_address or cfg.raft.address)
    path = os.path.join(raft_dir, PEERS_FILE)
    given = [p for p in cfg.cluster.peers if p != cfg.raft.address]
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        joining = not record.get("joined", True)
        if joining and not cfg.cluster.join_addr:
            raise RuntimeError("this node never finished joining its cluster: start it with "
                               "--cluster.join_addr (any member's HTTP host:port)")
        started_by = record.get("started_by")
        if started_by is None:       # recorded before the check: only a single node's data
            mismatch = not record["peers"] and bool(given) and not cfg.cluster.join_addr
        else:
            mismatch = started_by == "peers" and sorted(record["peers"]) != sorted(given)
        if mismatch:
            raise RuntimeError(_other_cluster(cfg, record["peers"], given))
        return list(record["peers"]), joining
    if cfg.cluster.join_addr:
        members, theirs = discover(cfg.cluster.join_addr)
        if cluster_id and theirs and theirs != cluster_id:
            raise RuntimeError(
                f"{cfg.node_dir} holds the data of cluster {cluster_id}, but "
                f"{cfg.cluster.join_addr} is a member of cluster {theirs}: a node joins with "
                f"no data of its own. Remove {cfg.node_dir} (take a backup first if its "
                "queues matter: doq backup) and start it again to join.")
        peers = [m for m in members if m != cfg.raft.address]
        joining = True
    else:
        peers = given
        joining = False
    _write_record(path, {"peers": peers, "joined": not joining,
                         "started_by": "join" if joining else "peers"})
    return peers, joining


def _other_cluster(cfg: Config, recorded: list[str], given: list[str]) -> str:
    """Why a node whose data was started with ``recorded`` partners may not start with
    ``given`` ones, and what to do."""
    def say(peers: list[str]) -> str:
        return ("no partners (a single-node cluster)" if not peers
                else "partners " + ", ".join(sorted(peers)))
    return (f"{cfg.node_dir} holds the data of a cluster that this node started with "
            f"{say(recorded)}, but --cluster.peers now gives it {say(given)}. Starting would "
            "make a second cluster beside the one its partners form. A node's partners are "
            "fixed when its cluster starts (later changes go through join and leave): start "
            "it with the same --cluster.peers as the first time; or, for a new cluster, stop "
            f"it and remove {cfg.node_dir} (take a backup first if its queues matter: doq "
            "backup, then doq restore into the new cluster); or, to add it to a running "
            f"cluster, remove {cfg.node_dir} and start it with --cluster.join_addr.")


def mark_joined(raft_dir: str) -> None:
    path = os.path.join(raft_dir, PEERS_FILE)
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    _write_record(path, {**record, "joined": True})


def _write_record(path: str, record: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


class _PeerRequests:
    """How this node's HTTP requests to other nodes are made: from which source address,
    signed with the cluster secret (``X-DOQ-Node``), over TLS with which context."""

    def __init__(self) -> None:
        self.source: str | None = None
        self.secret: ClusterSecret | None = None
        self.tls: ssl.SSLContext | None = None


_peers = _PeerRequests()


def configure_requests(secret: ClusterSecret | None, tls: ssl.SSLContext | None) -> None:
    """Sign requests to other nodes with ``secret`` and make them over TLS with ``tls``."""
    _peers.secret, _peers.tls = secret, tls


def _http_json(addr: str, method: str, path: str, body: Any = None,
               timeout: float = 5.0, headers: dict[str, str] | None = None,
               ) -> tuple[int, Any]:
    secret = _peers.secret

    def sign(method: str, path: str, payload: bytes) -> dict[str, str]:
        assert secret is not None
        return {"X-DOQ-Node": secret.sign_request(method, path, payload)}
    transport = Transport(_peers.tls, _peers.source, sign=sign if secret else None)
    return transport.once_json(addr, method, path, body, timeout, headers)


def discover(join_addr: str) -> tuple[list[str], str]:
    """(Raft addresses of the members, the cluster's id: "" until named), asked of the
    node at ``join_addr`` (HTTP host:port)."""
    last: Exception | None = None
    for _ in range(JOIN_ROUNDS):
        try:
            status, body = _http_json(join_addr, "GET", "/API/v1/cluster/servers")
            if status == 200 and body["servers"]:
                return [s["addr"] for s in body["servers"]], str(body.get("cluster_id", ""))
            last = RuntimeError(f"HTTP {status}")
        except (OSError, ValueError, KeyError) as exc:
            last = exc
        gevent.sleep(JOIN_PAUSE)
    raise RuntimeError(f"failed to join node at {join_addr}: {last}")


def request_join(join_addr: str, me: MemberInfo) -> None:
    """Ask the leader (found through ``join_addr``) to add this node; retries like discover()."""
    body = {"id": me.node_id, "addr": me.raft_addr, "http_addr": me.http_addr,
            "grpc_addr": me.grpc_addr}
    if me.client_http_addr:
        body["client_http_addr"] = me.client_http_addr
    if me.client_grpc_addr:
        body["client_grpc_addr"] = me.client_grpc_addr
    last: Any = None
    for _ in range(JOIN_ROUNDS):
        try:
            status, servers = _http_json(join_addr, "GET", "/API/v1/cluster/servers")
            # the address the nodes use: the listing's http_addr is the one for clients
            leaders = [s.get("peer_http_addr") or s.get("http_addr")
                       for s in servers["servers"] if s["is_leader"]]
            target = next((a for a in leaders if a), join_addr)
            status, answer = _http_json(target, "POST", "/API/v1/cluster/join", body, 15.0)
            if status == 200:
                return
            last = answer
        except (OSError, ValueError, KeyError) as exc:
            last = exc
        gevent.sleep(JOIN_PAUSE)
    raise RuntimeError(f"failed to join node at {join_addr}: {last}")


# -- the membership service -----------------------------------------------------------------
class Membership:
    def __init__(self, cfg: Config, node: RaftNode, fsm: StateMachine, service: Service,
                 http_addr: str, grpc_addr: str = "") -> None:
        self.cfg = cfg
        self.node = node
        self.fsm = fsm
        self.service = service
        self.me = MemberInfo(cfg.cluster.node_id, cfg.raft.address, http_addr, grpc_addr,
                             cfg.http.advertise, cfg.grpc.advertise if grpc_addr else "")
        self._changing = False
        self._greenlets: list[gevent.Greenlet] = []

    def start(self) -> None:
        self._greenlets = [gevent.spawn(self._announce_loop), gevent.spawn(self._removal_watch)]

    def stop(self) -> None:
        gevent.killall(self._greenlets, timeout=2)

    # -- identities ------------------------------------------------------------------------
    def _announce_loop(self) -> None:
        """Keep this node's identity in the replicated member list."""
        while True:
            known = self.fsm.member(self.me.raft_addr) == self.me
            if not known and self.node.leader_address is not None:
                try:
                    self.service.submit(self._info_op(self.me))
                    continue
                except DoqError as exc:
                    log.info("announcing this member failed (will retry): %s", exc)
            gevent.sleep(2.0 if known else 0.2)

    def _removal_watch(self) -> None:
        """A node removed from the cluster (``leave``) is told nothing by Raft: the leader
        stops replicating to it. One that has heard from no leader for LEADERLESS seconds
        asks the members it knows whether it is still one; when one of them, with a leader
        and of the same cluster, lists the members without it, this node logs so once and
        its /readyz says so (``Service.removed``)."""
        while not self.service.removed:
            gevent.sleep(LEADERLESS / 2)
            if self.node.leader_address is not None and \
                    self.node.leader_contact_age() < LEADERLESS:
                continue
            others = [m for addr, m in self.fsm.member_list().items()
                      if addr != self.me.raft_addr and m.http_addr]
            for member in others:
                members = self._members_seen_by(member.http_addr)
                if members is not None and self.me.raft_addr not in members:
                    self.service.removed = (
                        "removed from the cluster: its members are now "
                        f"{', '.join(sorted(members))}")
                    log.error("this node is no longer a member of the cluster (removed with "
                              "leave; %s told it, listing %s): it serves nothing. Stop it; "
                              "to bring it back, empty its data directory and start it with "
                              "--cluster.join", member.node_id, ", ".join(sorted(members)))
                    break

    def _members_seen_by(self, http_addr: str) -> set[str] | None:
        """The Raft addresses of the members the node at ``http_addr`` lists, when it has a
        leader and belongs to this cluster (None: it could not tell)."""
        try:
            status, body = _http_json(http_addr, "GET", "/API/v1/cluster/servers?local=true",
                                      timeout=2.0)
            servers = body["servers"] if status == 200 else []
            if not servers or not any(s.get("leader_addr") for s in servers) or \
                    str(body.get("cluster_id", "")) != self.fsm.cluster_id:
                return None
            return {str(s["addr"]) for s in servers}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    @staticmethod
    def _info_op(m: MemberInfo) -> C.Op:
        return C.member_info(m.node_id, m.raft_addr, m.http_addr, m.grpc_addr,
                             m.client_http_addr, m.client_grpc_addr)

    # -- changes (leader only) ---------------------------------------------------------------
    def _require_leader(self) -> None:
        if not self.node.is_leader:
            raise Unavailable("node is not the leader")

    def leader_http(self) -> str | None:
        """The leader's HTTP address when another node leads (for forwarding), else None."""
        if self.node.is_leader:
            return None
        leader = self.node.leader_address or ""
        member = self.fsm.member(leader)
        if member is not None and member.http_addr:
            return member.http_addr
        published = self.fsm.published_leader()      # what the leader published on election
        if published is not None and published.raft_addr == leader and published.http_addr:
            return published.http_addr
        raise Unavailable("leader address is empty")

    def forward(self, path: str, body: Any,
                headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """Send a membership request to the leader; its answer is returned as it is.
        ``headers``: the caller's credentials, which the leader checks as well."""
        target = self.leader_http()
        try:
            return _http_json(target or "", "POST", path, body, 15.0, headers)
        except (OSError, ValueError) as exc:
            raise Unavailable(f"cannot reach the leader: {exc}") from None

    def open_to_leader(self, method: str, path: str, payload: bytes | Iterable[bytes],
                       content_type: str, headers: dict[str, str], timeout: float,
                       ) -> tuple[Any, Any]:
        """Send one request to the leader's own (peer) address, for a caller that reached
        this follower only (its published address may not resolve where the caller is):
        the connection and its unread response, which the caller streams and closes. The
        caller's ``headers`` go along (the leader checks its key again); the request is not
        node-signed, so it is let through only as the caller is."""
        target = self.leader_http()
        if target is None:
            raise Unavailable("this node leads: nothing to relay")
        transport = Transport(_peers.tls, _peers.source)
        conn = transport.connect(target, timeout)
        try:
            response = transport.send(conn, method, path, payload, content_type,
                                      {**headers, RELAYED_HEADER: "1"})
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise Unavailable(f"cannot reach the leader at {target}: {exc}") from None
        return conn, response

    def _change_config(self, start: Callable[[Callable[[Any, int], None]], None],
                       added: str = "") -> None:
        """Propose one configuration change and wait for it to commit.

        Raft allows one single-server change at a time and PySyncObj does not enforce it (it
        never sets its "change in progress" index), so this node does: a change counts as in
        progress until its entry commits or fails, even after the caller has timed out.

        An addition (``added``: the new member's Raft address) whose member does not answer
        the leader is undone before the leader would step down for want of a majority
        (``raft.leader_fallback_timeout``): PySyncObj uses a configuration as soon as it is
        appended, so removing the member again needs only the members that answer; it
        commits, and the addition with it, instead of leaving the cluster without a leader.
        """
        if self._changing:
            raise Conflict("another membership change is in progress; retry when it is done")
        self._changing = True
        done: gevent.event.AsyncResult = gevent.event.AsyncResult()

        def finished(result: Any, error: int) -> None:
            self._changing = False
            done.set(error)

        try:
            start(finished)
        except Exception:
            self._changing = False
            raise
        error = self._wait_change(done, added)
        if error == 0:
            return
        if error == RaftError.REQUEST_DENIED:
            raise Conflict("the cluster configuration cannot change yet (new leader); retry")
        raise Unavailable(FAIL_TEXT.get(error, f"raft error {error}"))

    def _wait_change(self, done: gevent.event.AsyncResult, added: str) -> int:
        started = time.monotonic()
        grace = 0.6 * self.cfg.raft.leader_fallback_timeout
        first: float | None = None
        answered = not added
        while True:
            try:
                return int(done.get(timeout=0.05))
            except gevent.Timeout:
                pass
            elapsed = time.monotonic() - started
            if not answered:
                seen = self.node.last_response(added)
                if first is None:
                    first = seen
                elif seen is not None and seen > first:
                    answered = True
                if not answered and elapsed >= grace and self.node.is_leader:
                    answered = True                  # one undo, whatever its outcome
                    self._undo(functools.partial(self.node.remove_member, added))
            if elapsed >= self.cfg.raft.apply_timeout:
                raise Unavailable("timed out changing the cluster configuration (it stays "
                                  "pending until a majority of the new configuration has it)")

    def _undo(self, undo: Callable[[Callable[[Any, int], None]], None]) -> None:
        undone: gevent.event.AsyncResult = gevent.event.AsyncResult()
        undo(lambda result, error: undone.set(error))
        try:
            error = undone.get(timeout=self.cfg.raft.apply_timeout)
        except gevent.Timeout:
            error = None
        if error == 0:
            raise Unavailable("the new member did not answer the leader, so its addition was "
                              "undone before the cluster lost its majority; check that the "
                              "node is running and reachable, then retry")
        log.error("an addition to the cluster did not commit and undoing it failed (%s)",
                  FAIL_TEXT.get(error, error) if error is not None else "timed out")

    def _verify_peer(self, raft_addr: str) -> None:
        """The new member must answer a Raft handshake (with a secret: prove it holds it)."""
        try:
            wire.probe(raft_addr, self.node.doq_wire_security,
                       timeout=min(3.0, self.cfg.raft.apply_timeout))
        except wire.ProbeFailed as exc:
            raise PeerUnverified(f"addr: {exc}; a node is added only once it answers on its "
                                 f"Raft address (and holds the cluster secret)") from None

    @staticmethod
    def check_join(node_id: str, raft_addr: str, **addresses: str) -> None:
        """A join request's id and addresses (``addresses``: the optional ones, by field
        name: empty, or host:port of at most 255 characters)."""
        if not node_id or not raft_addr:
            raise InvalidArgument("id and addr must not be empty")
        for field, value in {"addr": raft_addr, **addresses}.items():
            if not value and field != "addr":
                continue
            try:
                split_host_port(value)
                fits = len(value) <= 255
            except ValueError:
                fits = False
            if not fits:
                raise InvalidArgument(f"{field}: expected host:port (at most 255 characters), "
                                      f"got {value[:300]!r}") from None

    def join(self, node_id: str, raft_addr: str, http_addr: str = "",
             grpc_addr: str = "", client_http_addr: str = "",
             client_grpc_addr: str = "") -> None:
        self.check_join(node_id, raft_addr, http_addr=http_addr, grpc_addr=grpc_addr,
                        client_http_addr=client_http_addr, client_grpc_addr=client_grpc_addr)
        self._require_leader()
        current = self.node.member_addresses()
        same_id = [a for a, m in self.fsm.member_list().items() if m.node_id == node_id]
        if raft_addr in current and same_id in ([], [raft_addr]):
            self._record(node_id, raft_addr, http_addr, grpc_addr, client_http_addr,
                         client_grpc_addr)
            return                                       # already a member: nothing to change
        if self._changing:
            raise Conflict("another membership change is in progress; retry when it is done")
        self._verify_peer(raft_addr)
        for addr in same_id:                             # the id moved to a new address
            if addr != raft_addr and addr in current:
                self._change_config(functools.partial(self.node.remove_member, addr))
        if raft_addr in current:                          # the address has a new id
            self._change_config(functools.partial(self.node.remove_member, raft_addr))
        self._change_config(functools.partial(self.node.add_member, raft_addr), added=raft_addr)
        self._record(node_id, raft_addr, http_addr, grpc_addr, client_http_addr,
                     client_grpc_addr)

    def _record(self, node_id: str, raft_addr: str, http_addr: str, grpc_addr: str,
                client_http_addr: str = "", client_grpc_addr: str = "") -> None:
        known = self.fsm.member(raft_addr)
        info = MemberInfo(node_id, raft_addr, http_addr or (known.http_addr if known else ""),
                          grpc_addr or (known.grpc_addr if known else ""),
                          client_http_addr or (known.client_http_addr if known else ""),
                          client_grpc_addr or (known.client_grpc_addr if known else ""))
        if known != info:
            self.service.submit(self._info_op(info))

    def leave(self, node_id: str) -> None:
        if not node_id:
            raise InvalidArgument("id is required")
        self._require_leader()
        addr = self._address_of(node_id)
        self._await_a_known_member(addr)
        if addr == self.me.raft_addr:
            self._hand_over_and_forward(node_id)
            return
        self._change_config(functools.partial(self.node.remove_member, addr))
        self.service.submit(C.member_forget(addr))

    def _await_a_known_member(self, leaving: str, timeout: float = 5.0) -> None:
        """Wait (up to ``timeout``) until a member that stays has its HTTP address in the
        replicated member list. The node that leaves learns of its removal by asking such a
        member (``_removal_watch``); in a cluster that has only just started, the members'
        announcements may not have committed yet. Past the timeout the removal goes on."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            staying = self.node.member_addresses() - {leaving}
            if any((m := self.fsm.member(a)) is not None and m.http_addr for a in staying):
                return
            gevent.sleep(0.05)
        log.info("removing %s before any member that stays has announced its address: it "
                 "may not learn of its removal", leaving)

    def _address_of(self, node_id: str) -> str:
        if node_id == self.me.node_id:
            return self.me.raft_addr
        for addr, member in self.fsm.member_list().items():
            if member.node_id == node_id and addr in self.node.member_addresses():
                return addr
        if node_id in self.node.member_addresses():
            return node_id                               # an id that is its Raft address
        raise MemberNotFound(f"no cluster member with id {node_id!r}")

    def _hand_over_and_forward(self, node_id: str) -> None:
        """The leader cannot remove itself: hand leadership over, then ask the new leader."""
        if not self.transfer_leadership():
            raise Unavailable("could not hand leadership over before leaving")
        target = None
        for _ in range(60):                  # until the new leader's address is known here
            try:
                target = self.leader_http()
                break
            except Unavailable:
                gevent.sleep(0.05)
        if target is None:
            raise Unavailable("the new leader's address is not known yet; retry")
        # By address: the new leader may not have learned this node's id yet.
        status, answer = _http_json(target, "POST", "/API/v1/cluster/leave",
                                    {"id": self.me.raft_addr}, 15.0)
        if status != 200:
            message = (answer or {}).get("errors", [{}])[0].get("message", f"HTTP {status}")
            raise Unavailable(f"the new leader refused the leave: {message}")

    def transfer_leadership(self, timeout: float = 5.0) -> bool:
        """Make another up-to-date member the leader; True once someone else leads."""
        if not self.node.is_leader or not self.node.otherNodes:
            return not self.node.is_leader
        deadline = gevent.get_hub().loop.now() + timeout
        while gevent.get_hub().loop.now() < deadline:
            self.node.transfer_leadership()
            for _ in range(20):
                gevent.sleep(0.05)
                leader = self.node.leader_address
                if not self.node.is_leader and leader not in (None, self.me.raft_addr):
                    return True
        return False

    # -- the servers list ------------------------------------------------------------------------
    def servers(self, headers: dict[str, str] | None = None) -> list[ServerInfo]:
        """Every member; the replication lag comes from the leader (asked when we are not it,
        with the caller's ``headers``)."""
        if not self.node.is_leader:
            remote = self._servers_from_leader(headers)
            if remote is not None:
                return remote
        return self.local_servers()

    def local_servers(self) -> list[ServerInfo]:
        leader = self.node.leader_address or ""
        lags = self.node.follower_lags() if self.node.is_leader else {}
        links = self.node.connected_peers() if self.node.is_leader else {}
        out = []
        for addr in sorted(self.node.member_addresses()):
            m = self.fsm.member(addr) or (self.me if addr == self.me.raft_addr else None)
            me = addr == leader and self.node.is_leader
            lag = 0 if me else lags.get(addr)
            out.append(ServerInfo(
                m.node_id if m else addr, addr, leader, addr == leader, "Voter",
                (m.client_http_addr or m.http_addr) if m else "",
                (m.client_grpc_addr or m.grpc_addr) if m else "",
                lag, True if me else links.get(addr),
                m.http_addr if m else "", m.grpc_addr if m else ""))
        return out

    def _servers_from_leader(self, headers: dict[str, str] | None) -> list[ServerInfo] | None:
        leader = self.fsm.member(self.node.leader_address or "")
        if leader is None or not leader.http_addr:
            return None
        try:
            status, body = _http_json(leader.http_addr, "GET",
                                      "/API/v1/cluster/servers?local=true", timeout=1.0,
                                      headers=headers)
        except (OSError, ValueError):
            return None
        if status != 200:
            return None
        return [ServerInfo(s["id"], s["addr"], s["leader_addr"], s["is_leader"],
                           s.get("suffrage", "Voter"), s.get("http_addr", ""),
                           s.get("grpc_addr", ""), s.get("lag"), s.get("connected"),
                           s.get("peer_http_addr") or s.get("http_addr", ""),
                           s.get("peer_grpc_addr") or s.get("grpc_addr", ""))
                for s in body["servers"]]
