"""Who may call which HTTP route (L5): API keys, node signatures, the loopback rule, CORS.

Every route of ``http.api.ROUTES`` has a :class:`~doq_lib.auth.Rule` in :data:`ROUTE_RULES`
(a test fails for a route without one). A request is let through as:

* another **node**, when it carries ``X-DOQ-Node`` signed with the cluster secret (forwarded
  joins and leaves, a joining node, the servers list asked of the leader);
* with a **keys file**: the key of its ``Authorization: Bearer`` header (401 without a valid
  one), if its role and queue patterns allow the route (403 otherwise);
* without a keys file: anyone, except that routes marked ``loopback`` (restore, join, leave,
  ``/internal/*``) are accepted only from loopback clients.

State-changing requests whose ``Origin`` header names another site are refused (403), unless
the origin is listed in ``http.cors_origins``: a page elsewhere must not drive a local node
through the user's browser. CORS headers are sent only for listed origins.
"""
from __future__ import annotations

import ipaddress
import logging
from typing import Any

from doq_lib.auth import ANONYMOUS, NODE, ApiKey, KeyStore, Permission, Rule, Scope, bearer_token
from doq_lib.errors import PermissionDenied, Unauthenticated
from doq_lib.secret import ClusterSecret

log = logging.getLogger(__name__)

NODE_HEADER = "X-DOQ-Node"
KEY_ENVIRON = "doq.key"

_R, _P, _C, _A = Permission.READ, Permission.PRODUCE, Permission.CONSUME, Permission.ADMIN
_Q, _ANY, _CL = Scope.QUEUE, Scope.ANY, Scope.CLUSTER

#: op id (http.api.ROUTES) -> what it needs.
ROUTE_RULES: dict[str, Rule] = {
    "generate-id": Rule(_P, _ANY),
    "db-backup": Rule(_A, _CL),
    "db-restore": Rule(_A, _CL, loopback=True),
    "cluster-servers": Rule(_R, _ANY),
    "cluster-join": Rule(_A, _CL, loopback=True),
    "cluster-leave": Rule(_A, _CL, loopback=True),
    "create-queue": Rule(_A, _Q),            # the queue is named in the body
    "queues": Rule(_R, _ANY),                # listed queues are filtered by the key's patterns
    "queue-info": Rule(_R, _Q),
    "update-queue": Rule(_A, _Q),
    "delete-queue": Rule(_A, _Q),
    "enqueue": Rule(_P, _Q),
    "enqueue-batch": Rule(_P, _Q),
    "dequeue": Rule(_C, _Q),
    "ack-batch": Rule(_C, _Q),
    "nack-batch": Rule(_C, _Q),
    "get": Rule(_R, _Q),
    "delete": Rule(_C, _Q),
    "ack": Rule(_C, _Q),
    "nack": Rule(_C, _Q),
    "touch": Rule(_C, _Q),
    "reject": Rule(_C, _Q),
    "redrive": Rule(_A, _Q),                 # the target is checked too (http/api.py)
    "update-priority": Rule(_C, _Q),
    "purge": Rule(_A, _Q),
    "pause": Rule(_A, _Q),
    "resume": Rule(_A, _Q),
    "pause-group": Rule(_A, _Q),
    "resume-group": Rule(_A, _Q),
    "groups": Rule(_R, _Q),
    "consumers": Rule(_R, _Q),
    "put-schedule": Rule(_A, _Q),
    "schedules": Rule(_R, _Q),
    "schedule": Rule(_R, _Q),
    "delete-schedule": Rule(_A, _Q),
    "pause-schedule": Rule(_A, _Q),
    "resume-schedule": Rule(_A, _Q),
    "browse": Rule(_R, _Q),                  # GET .../messages?browse=true (ROUTE_VARIANTS)
    "explain": Rule(_R, _Q),
    "internal-status": Rule(_A, _CL, loopback=True),
    "internal-state": Rule(_A, _CL, loopback=True),
}
#: A route whose query names another operation: op id -> (query flag, the op id it becomes).
ROUTE_VARIANTS: dict[str, tuple[str, str]] = {"dequeue": ("browse", "browse")}
METRICS_RULE = Rule(_R, _CL)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def is_loopback_client(environ: dict[str, Any]) -> bool:
    try:
        return ipaddress.ip_address(environ.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


class Authorizer:
    """Decides for one node; ``keys`` None means no keys file (no authentication)."""

    def __init__(self, keys: KeyStore | None, secret: ClusterSecret | None,
                 cors_origins: tuple[str, ...] = ()) -> None:
        self.keys = keys
        self.secret = secret
        self.cors_origins = frozenset(cors_origins)

    def authorize(self, call: Any, rule: Rule, queue: str | None = None) -> ApiKey:
        """The principal of ``call`` (an :class:`doq_lib.http.calls.Call`), if ``rule`` lets it
        through (else raises Unauthenticated / PermissionDenied)."""
        environ = call.environ
        if environ.get("HTTP_X_DOQ_NODE"):
            key = self._node(call)
        elif self.keys is None:
            if rule.loopback and not is_loopback_client(environ):
                raise PermissionDenied(
                    "this operation is accepted only from loopback clients while the API has "
                    "no keys (configure auth.keys_file to allow it with an admin key)")
            key = ANONYMOUS
        else:
            key = self._key(environ)
        problem = key.problem(rule, queue)
        if problem:
            raise PermissionDenied(problem)
        environ[KEY_ENVIRON] = key
        return key

    def _key(self, environ: dict[str, Any]) -> ApiKey:
        assert self.keys is not None
        header = environ.get("HTTP_AUTHORIZATION")
        token = bearer_token(header)
        if token is None:
            raise Unauthenticated("an API key is required: send 'Authorization: Bearer <key>'"
                                  if not header else
                                  "the Authorization header must be 'Bearer <key>'")
        key = self.keys.authenticate(token)
        if key is None:
            raise Unauthenticated("the API key is not valid (unknown or revoked)")
        return key

    def _node(self, call: Any) -> ApiKey:
        if self.secret is None:
            raise Unauthenticated("a node-signed request, but this node has no cluster secret")
        if call.chunked:           # nodes send a Content-Length
            raise Unauthenticated("a node-signed request must not use chunked encoding")
        data = call.body()         # read once: the route reads the same bytes
        environ = call.environ
        target = environ.get("PATH_INFO", "")
        if environ.get("QUERY_STRING"):
            target += "?" + environ["QUERY_STRING"]
        if not self.secret.verify_request(environ["HTTP_X_DOQ_NODE"], call.method, target,
                                          data):
            raise Unauthenticated("the node signature is not valid (another cluster secret, "
                                  "a changed request or a clock more than a minute off)")
        return NODE

    @staticmethod
    def current(call: Any) -> ApiKey:
        """The principal authorized for ``call``."""
        key: ApiKey = call.environ.get(KEY_ENVIRON, ANONYMOUS)
        return key

    def check_queue(self, call: Any, rule: Rule, queue: str) -> None:
        """A second check once the queue is known (create: it is named in the body)."""
        problem = self.current(call).problem(rule, queue)
        if problem:
            raise PermissionDenied(problem)

    # -- browsers ----------------------------------------------------------------------------
    def cross_site_problem(self, environ: dict[str, Any]) -> str | None:
        """Why a state-changing request from another site's page is refused (None: fine)."""
        origin = environ.get("HTTP_ORIGIN")
        if not origin or environ.get("REQUEST_METHOD", "GET") in SAFE_METHODS:
            return None
        if origin in self.cors_origins or "*" in self.cors_origins:
            return None
        host = environ.get("HTTP_HOST", "")
        scheme = environ.get("wsgi.url_scheme", "http")
        if origin == f"{scheme}://{host}":
            return None
        return (f"a request from a page of {origin[:200]} was refused: add that origin to "
                f"http.cors_origins to allow it")

    def cors_headers(self, environ: dict[str, Any]) -> list[tuple[str, str]]:
        origin = environ.get("HTTP_ORIGIN")
        if not origin or not (origin in self.cors_origins or "*" in self.cors_origins):
            return []
        return [("Access-Control-Allow-Origin", origin), ("Vary", "Origin"),
                ("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS"),
                ("Access-Control-Allow-Headers", "Authorization, Content-Type"),
                ("Access-Control-Expose-Headers", "X-Last-Version, X-Request-Id"),
                ("Access-Control-Max-Age", "600")]
