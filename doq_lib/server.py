"""Builds a node and runs it (L6): storage, state machine, Raft, service, HTTP; signals.

No business logic lives here. ``run_server`` expects gevent to be monkey-patched already
(``doq.py serve`` does it first).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

import gevent
import gevent.event

from doq_lib import k8s
from doq_lib.auth import KeysFileError, KeyStore
from doq_lib.clock import node_clock
from doq_lib.cluster import (
    Membership,
    bootstrap_peers,
    configure_requests,
    mark_joined,
    request_join,
)
from doq_lib.config import Config, split_host_port
from doq_lib.fsm import StateMachine
from doq_lib.grpc.server import HubServer, build_hub_server
from doq_lib.http import Middleware, build_app
from doq_lib.http.auth import Authorizer
from doq_lib.http.server import Limits, listener, make_server
from doq_lib.lmdb_store import LmdbStore
from doq_lib.log import setup_logging
from doq_lib.metrics import Metrics, QueueSample, RaftSample
from doq_lib.raft.node import RaftNode
from doq_lib.raft.proposer import RaftProposer
from doq_lib.raft.snapshot import recover_store
from doq_lib.secret import SecretError, load_secret
from doq_lib.service import Service
from doq_lib.tls import TlsError, peer_context, server_context

log = logging.getLogger(__name__)
WEBUI_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "webui")


class Node:
    """Everything one DOQ node runs, wired together."""

    def __init__(self, cfg: Config) -> None:
        self.slice_leader: k8s.EndpointSliceLeader | None = None
        if cfg.cluster.service_name:                      # Kubernetes mode (SPEC §7.4, §7.5)
            cfg = k8s.with_discovery(cfg, k8s.discover_with_retries(cfg))
            self.slice_leader = k8s.EndpointSliceLeader.from_environment(cfg)
        self.cfg = cfg
        os.makedirs(cfg.node_dir, mode=0o700, exist_ok=True)
        self.store = LmdbStore(os.path.join(cfg.node_dir, "store"), cfg.storage.map_size,
                               durable=cfg.storage.fsync_store)
        if not self.store.trusted():
            recover_store(cfg.node_dir, self.store)
        self.store.mark_open()
        self.fsm = StateMachine(self.store, cfg.queue.stats_window_side,
                                fault_injection=cfg.faults.enabled,
                                history_seconds=cfg.storage.history_seconds)
        self.secret = load_secret(cfg.raft.password, cfg.raft.password_file)
        http_tls = server_context(cfg.http.tls_cert, cfg.http.tls_key,
                                  cfg.http.tls_client_ca) if cfg.http.tls_cert else None
        # Requests to other nodes use HTTPS when this node serves it (the cluster is uniform),
        # with this node's certificate as client certificate under mutual TLS.
        configure_requests(self.secret, peer_context(
            cfg.cluster.tls_ca, cfg.http.tls_cert if cfg.http.tls_client_ca else "",
            cfg.http.tls_key) if http_tls else None)
        self.keys = KeyStore.open(cfg.auth.keys_file) if cfg.auth.keys_file else None
        self.auth = Authorizer(self.keys, self.secret, cfg.http.cors_origins)
        peers, self.joining = bootstrap_peers(cfg, os.path.join(cfg.node_dir, "raft"),
                                              self.fsm.cluster_id)
        self.raft = RaftNode(cfg, self.store, self.fsm, on_leadership=self._on_leadership,
                             peers=peers, secret=self.secret)
        clock = self.clock = self.raft.clock = node_clock(cfg.faults.clock_offset_file,
                                                          cfg.faults.enabled)
        # How recently the leader (or a majority, on the leader) must have been heard from for
        # this node to accept a write: several heartbeats, far below the election timeout.
        freshness = max(0.5, 5 * cfg.raft.append_entries_period)
        self.proposer = RaftProposer(self.raft, clock, cfg.raft.max_inflight,
                                     cfg.raft.max_batch_bytes, cfg.raft.apply_timeout, freshness)
        self.service = Service(cfg, self.proposer, self.fsm, clock,
                               backup_key=self.secret.key("backup") if self.secret else None)
        self.raft.storage_problem = self.service.disk.problem
        self.listener = listener(cfg.http.host or "0.0.0.0", cfg.http.port)
        host = split_host_port(cfg.raft.address)[0] or "localhost"
        self.service.http_addr = f"{host}:{self.http_port}"
        self.grpc: Any = None
        self.metrics = Metrics(self._queue_samples, self._raft_sample, clock.now,
                               self._node_gauges) if cfg.prometheus.enabled else None
        if cfg.grpc.address:
            context = server_context(cfg.grpc.tls_cert, cfg.grpc.tls_key,
                                     cfg.grpc.tls_client_ca, what="grpc.tls_cert") \
                if cfg.grpc.tls_cert else None
            if context is not None:
                context.set_alpn_protocols(["h2"])
            # HTTP/2 by h2 in the event loop (doq_lib/grpc/)
            self.grpc, grpc_port = build_hub_server(
                self.service, cfg.grpc.address, metrics=self.metrics, keys=self.keys,
                ssl_context=context, max_connections=cfg.grpc.max_connections,
                max_held_bytes=cfg.grpc.max_held_bytes)
            # Advertised like the Raft address: its host, the bound port (SPEC §4.6).
            self.service.grpc_addr = f"{host}:{grpc_port}"
        self.membership = Membership(cfg, self.raft, self.fsm, self.service,
                                     self.service.http_addr, self.service.grpc_addr)
        app = build_app(self.service, self.membership, self.metrics, WEBUI_DIR, self.auth)
        limits = Limits(cfg.http.header_timeout, cfg.http.body_timeout, cfg.http.idle_timeout,
                        cfg.http.max_connections, cfg.http.request_timeout,
                        cfg.http.min_body_rate, cfg.http.max_held_bytes)
        self.http = make_server(self.listener,
                                Middleware(app, self.service, self.metrics, self.auth),
                                logging.getLogger("doq.http"), http_tls, limits)
        self.scheme = "https" if http_tls else "http"
        self.stopped = gevent.event.Event()
        self._stopping = False
        self.stop_failed = False

    def _node_gauges(self) -> list[tuple[str, str, float]]:
        disk = self.service.disk
        held = [("doq_http_held_bytes", "request body bytes held for HTTP requests not yet "
                 "answered (at most http.max_held_bytes)", self.http.held)] \
            if getattr(self, "http", None) is not None else []
        grpc_hub = [
            ("doq_grpc_connections", "open gRPC connections",
             len(self.grpc.connections)),
            ("doq_grpc_held_bytes", "request bytes held for gRPC calls not yet handled "
             "(at most grpc.max_held_bytes)", self.grpc.held),
        ] if isinstance(self.grpc, HubServer) else []
        return held + grpc_hub + [
            ("doq_clock_offset_seconds", "the wall clock minus the time this node uses (which "
             "follows wall clock jumps only slowly, doq_lib/clock.py)", self.clock.offset),
            ("doq_storage_free_bytes", "free bytes on the disk of this node's data "
             "(-1: unknown)", disk.free()),
            ("doq_storage_writes_blocked", "1 while new messages are refused: free space below "
             "storage.min_free_bytes", 1 if disk.problem() else 0),
        ]

    def _on_leadership(self, leader: bool) -> None:
        if leader and self.slice_leader is not None:      # Kubernetes: steer the client Service
            gevent.spawn(self.slice_leader.mark_leader_while, lambda: self.raft.is_leader)
        self.service.on_leadership(leader)

    def _queue_samples(self) -> list[QueueSample]:
        return [QueueSample(*c) for c in self.fsm.queue_counters()]

    def _raft_sample(self) -> RaftSample:
        status = self.raft.status()
        committer = self.proposer.stats()
        journal = self.raft.doq_journal.stats
        return RaftSample(status["state"], status["term"], status["commit_index"],
                          status["fsm_applied"], journal.syncs, journal.sync_seconds,
                          committer["entries_proposed"], committer["ops_proposed"],
                          status["match_index"] if status["state"] == "leader" else {})

    @property
    def http_port(self) -> int:
        return int(self.listener.getsockname()[1])

    def start(self) -> None:
        self.raft.start()
        self.service.start()
        self.membership.start()
        if self.joining:                 # SPEC §7.6: join before serving HTTP
            request_join(self.cfg.cluster.join_addr, self.membership.me)
            mark_joined(os.path.join(self.cfg.node_dir, "raft"))
        self.http.start()
        if self.grpc is not None:
            self.grpc.start()
        grpc_part = "" if self.grpc is None else \
            f", gRPC{' over TLS' if self.cfg.grpc.tls_cert else ''} on {self.service.grpc_addr}"
        log.info("node %s serving %s on port %d%s, Raft on %s", self.cfg.cluster.node_id,
                 self.scheme.upper(), self.http_port, grpc_part, self.cfg.raft.address)
        if self.keys is None:
            log.warning("the HTTP and gRPC APIs are unauthenticated (no auth.keys_file): "
                        "anyone who reaches them can read and change every queue; restore, "
                        "join, leave and /internal/* are accepted from loopback clients only")
        else:
            count = len(self.keys)
            log.info("API keys from %s: %d key%s", self.cfg.auth.keys_file, count,
                     "" if count == 1 else "s")

    def stop(self) -> None:
        if self._stopping:                    # a second signal while stopping: let it finish
            self.stopped.wait()
            return
        self._stopping = True
        try:
            self._stop()
        except Exception:  # noqa: BLE001 - e.g. the data directory vanished: exit anyway
            log.exception("stopping the node failed; exiting anyway")
            self.stop_failed = True
        finally:
            self.stopped.set()

    def _stop(self) -> None:
        if self.raft.is_leader and self.raft.otherNodes:
            # Hand leadership over first: writes fail for a moment, not for an election.
            if self.membership.transfer_leadership(timeout=3.0):
                log.warning("leadership handed over to %s before stopping",
                            self.raft.leader_address)
            else:
                log.warning("could not hand leadership over before stopping")
        self.http.stop(timeout=2)
        if self.grpc is not None:
            self.grpc.stop(grace=1).wait(2)
        self.membership.stop()
        self.service.stop()
        self.raft.stop()
        self.store.mark_clean()
        self.store.close()


def run_server(cfg: Config) -> int:
    setup_logging(cfg.logging.mode, cfg.logging.level)
    split_host_port(cfg.raft.address)
    try:
        node = Node(cfg)
        node.start()
    except (OSError, RuntimeError, k8s.DiscoveryError, SecretError, KeysFileError,
            TlsError) as exc:
        print(f"doq: cannot start: {exc}", file=sys.stderr)
        return 1

    def shutdown(*_: Any) -> None:
        gevent.spawn(node.stop)

    for sig in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(sig, shutdown)
    node.stopped.wait()
    return 1 if node.stop_failed else 0
