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
        out = []
        for server in self.client.servers():
            status = NodeStatus(server)
            if server.http_addr:
                self._fill(status, server.http_addr)
            out.append(status)
        return out

    def _fill(self, status: NodeStatus, addr: str) -> None:
        """Role, term and indexes from the node's /internal/status (admin keys only); with
        a key that may not read it, only whether the node is alive (/livez)."""
        try:
            code, body = self._get(addr, "/internal/status")
            if code in (401, 403):
                code, _ = self._get(addr, "/livez")
                status.healthy = code == 200
                return
            if code != 200:
                raise ValueError(f"status {code}")
            raft = json.loads(body)["raft"]
            status.state, status.term = raft["state"], raft["term"]
            status.commit, status.applied = raft["commit_index"], raft["fsm_applied"]
            status.healthy = True
        except (OSError, ValueError, KeyError, http.client.HTTPException):
            status.healthy = False

    def _get(self, addr: str, path: str) -> tuple[int, bytes]:
        return self.client.http.once(addr, "GET", path, timeout=min(self.timeout, 1.5))
