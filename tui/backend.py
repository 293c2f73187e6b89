"""The console's view of the cluster: HTTP calls to any node, retried through the others."""
from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Sequence

from doq_lib.client import NO_SECURITY, HttpClient, RetryPolicy, Security
from doq_lib.models import QueueInfo, ServerInfo


@dataclass
class NodeStatus:
    server: ServerInfo
    state: str = "?"
    term: int | None = None
    commit: int | None = None
    applied: int | None = None
    healthy: bool = False
    # "direct": the node answered this console; "leader": it could not be reached from here
    # (e.g. it advertises a name only the nodes resolve) and is shown as the leader sees it
    seen: str = "direct"


class Backend:
    """What the screens need, over the HTTP client (blocking: call from worker threads)."""

    def __init__(self, urls: Sequence[str], timeout: float = 3.0,
                 security: Security = NO_SECURITY) -> None:
        self.client = HttpClient(urls, timeout=timeout,
                                 retry=RetryPolicy(attempts=len(urls) + 1, deadline=timeout),
                                 discover=False, security=security)
        self.timeout = timeout

    @property
    def node(self) -> str:
        return self.client.node

    def close(self) -> None:
        self.client.close()

    def queues(self) -> list[QueueInfo]:
        return self.client.queues()

    def cluster(self) -> list[NodeStatus]:
        """Every member as it answers this console. The node the console talks to is asked
        at the address it was given; the others at the addresses they advertise, and one that
        cannot be reached from here is shown as the leader sees it (connected or not)."""
        servers = self.client.servers()
        here = NodeStatus(ServerInfo("", "", "", False))
        here_id = self._fill(here, self.client.node)
        out = []
        for server in servers:
            status = NodeStatus(server)
            if here.healthy and (server.id == here_id or server.http_addr == self.client.node):
                status.state, status.term = here.state, here.term
                status.commit, status.applied = here.commit, here.applied
                status.healthy = True
            elif server.http_addr:
                self._fill(status, server.http_addr)
            if not status.healthy and server.connected:
                status.healthy, status.seen = True, "leader"
                status.state = "leader" if server.is_leader else "follower"
            out.append(status)
        return out

    def _fill(self, status: NodeStatus, addr: str) -> str | None:
        """Role, term and indexes from the node's /internal/status (admin keys only); with
        a key that may not read it, only whether the node is alive (/livez). The node's id
        when it said it."""
        try:
            code, body = self._get(addr, "/internal/status")
            if code in (401, 403):
                code, _ = self._get(addr, "/livez")
                status.healthy = code == 200
                return None
            if code != 200:
                raise ValueError(f"status {code}")
            answer = json.loads(body)
            raft = answer["raft"]
            status.state, status.term = raft["state"], raft["term"]
            status.commit, status.applied = raft["commit_index"], raft["fsm_applied"]
            status.healthy = True
            return str(answer.get("node_id") or "") or None
        except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException):
            status.healthy = False
            return None

    def _get(self, addr: str, path: str) -> tuple[int, bytes]:
        return self.client.http.once(addr, "GET", path, timeout=min(self.timeout, 1.5))
