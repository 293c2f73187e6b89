"""The REST API (L5): Bottle routes over :class:`doq_lib.service.Service` (SPEC §3).

Errors are turned into RFC 9457 problem details in one place (:func:`problem_for`), from the
route's fixed failure status and ``detail`` (SPEC §3.3) and the error's own message. Consensus
failures (no leader, no quorum, timeouts) answer 503 on every route so clients can retry.

The package: ``calls`` (the request and problem answers), ``parsing`` (reading a request),
``api`` (the route handlers and ``ROUTES``), ``app`` (the WSGI application), ``auth`` (API keys
and node signatures), ``schema`` (request bodies), ``openapi`` (the API document), ``server``
(the HTTP/1.1 server).
"""
from doq_lib.http.api import ROUTES
from doq_lib.http.app import Middleware, build_app
from doq_lib.http.calls import FAILURES

__all__ = ["FAILURES", "ROUTES", "Middleware", "build_app"]
