"""The WSGI application (L5): routes guarded by API keys, Bottle for the rest (docs, web UI,
metrics), and :class:`Middleware` (probes, CORS, security headers, request ids, metrics)."""
from __future__ import annotations

import json
import logging
import operator
import os
import time
from typing import Any, Callable, Iterable

import bottle
import yaml
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from doq_lib.cluster import Membership
from doq_lib.errors import DoqError, PermissionDenied, Unauthenticated
from doq_lib.http import openapi
from doq_lib.http.api import ROUTES, Api
from doq_lib.http.auth import METRICS_RULE, ROUTE_RULES, ROUTE_VARIANTS, Authorizer
from doq_lib.http.calls import (
    CURRENT_CALL,
    FAILURES,
    MAX_BODY,
    REASONS,
    SECURITY_HEADERS,
    Call,
    HttpProblem,
    access_log,
    auth_problem,
    log,
    new_request_id,
    problem_answer,
    problem_body,
    problem_for,
)
from doq_lib.http.parsing import check_path_names, query_flag
from doq_lib.http.schema import SCHEMAS
from doq_lib.metrics import Metrics
from doq_lib.service import Service


def _guard(op_id: str, handler: Callable[..., bytes], auth: Authorizer) -> Callable[..., bytes]:
    rule = ROUTE_RULES[op_id]
    variant = ROUTE_VARIANTS.get(op_id)

    def guarded(**kwargs: str) -> bytes:
        call = CURRENT_CALL.get()
        this_op, this_rule = op_id, rule
        try:
            if variant is not None and query_flag(variant[0]):
                this_op = variant[1]            # e.g. a browse: read, not consume
                this_rule = ROUTE_RULES[this_op]
            auth.authorize(call, this_rule, kwargs.get("queue_name"))
            check_path_names(kwargs)
            return handler(**kwargs)
        except HttpProblem as exc:
            return problem_answer(exc)
        except (Unauthenticated, PermissionDenied) as exc:
            return problem_answer(auth_problem(exc))
        except DoqError as exc:
            return problem_answer(problem_for(this_op, exc))
        except Exception:  # noqa: BLE001 - a bug: answer 500, keep serving
            log.exception("unhandled error in %s", this_op)
            return problem_answer(HttpProblem(500, FAILURES[this_op][1],
                                        [{"message": "internal server error"}]))
    guarded.__name__ = handler.__name__
    return guarded


def _call_api(environ: dict[str, Any], handler: Callable[..., Any],
              args: dict[str, str]) -> tuple[Call, Any]:
    """Run an API handler for ``environ``: (the call with its status and headers, body)."""
    call = Call(environ)
    token = CURRENT_CALL.set(call)
    try:
        return call, handler(**args)
    finally:
        CURRENT_CALL.reset(token)


def _through_bottle(handler: Callable[..., Any]) -> Callable[..., Any]:
    """The same handler as a Bottle callback (the Middleware normally calls it directly)."""
    def callback(**args: str) -> Any:
        call, body = _call_api(bottle.request.environ, handler, args)
        bottle.response.status = call.status
        bottle.response.content_type = call.content_type
        for name, value in call.headers:
            bottle.response.add_header(name, value)
        return body
    return callback


def build_app(service: Service, membership: Membership, metrics: Metrics | None,
              webui_dir: str, auth: Authorizer | None = None) -> bottle.Bottle:
    bottle.BaseRequest.MEMFILE_MAX = MAX_BODY + 1
    auth = auth or Authorizer(None, None)
    app = bottle.Bottle()
    app.config["catchall"] = False           # errors reach _guard, not Bottle's error page
    app.config["json.disable"] = True        # handlers return bytes themselves
    api = Api(service, membership, auth)
    # Bottle routes every request; the API's handlers are then called directly by the
    # Middleware (see _call_api), Bottle's own request handling only serves the rest.
    app.doq_api = {}
    for method, path, op_id, name in ROUTES:
        handler = _guard(op_id, operator.attrgetter(name)(api), auth)
        app.doq_api[op_id] = handler
        app.route(path, method, _through_bottle(handler), name=op_id)
    app.route("/healthz", "GET", lambda: _plain("OK"))
    if metrics is not None:
        app.route("/metrics", "GET", lambda: _metrics(metrics, auth))
    _add_docs(app, webui_dir)
    _add_static(app, webui_dir)
    for status in (400, 403, 413, 414):
        app.error(status)(_bottle_error(status))
    app.error(404)(lambda err: problem_answer(HttpProblem(404, REASONS[404])))
    app.error(405)(_not_allowed_or_unknown(app))
    return app


def _bottle_error(status: int) -> Callable[[Any], bytes]:
    """Bottle's own error pages (static files outside the root, multipart limits ...) as
    problem details, like every other error."""
    def handler(err: Any) -> bytes:
        body = getattr(err, "body", "") or REASONS[status]
        return problem_answer(HttpProblem(status, REASONS[status],
                                    [{"message": str(body)[:300]}]))
    return handler


def _not_allowed_or_unknown(app: bottle.Bottle) -> Callable[[Any], bytes]:
    """405 for a known path; 404 for a path only a web UI page (GET) matched."""
    known = bottle.Router()
    for rule in dict.fromkeys(r.rule for r in app.routes if "<path:path>" not in r.rule
                              and r.rule != "/"):
        known.add(rule, "ANY", None)

    def handler(err: Any) -> bytes:
        try:
            known.match({"PATH_INFO": bottle.request.path, "REQUEST_METHOD": "GET"})
        except bottle.HTTPError:
            bottle.response.headers.pop("Allow", None)
            return problem_answer(HttpProblem(404, REASONS[404]))
        return problem_answer(HttpProblem(405, REASONS[405]))
    return handler


def _plain(text: str) -> bytes:
    bottle.response.content_type = "text/plain; charset=utf-8"
    return text.encode()


def _metrics(metrics: Metrics, auth: Authorizer) -> bytes:
    try:
        auth.authorize(Call(bottle.request.environ), METRICS_RULE)
    except (Unauthenticated, PermissionDenied) as exc:
        return problem_answer(auth_problem(exc))
    bottle.response.content_type = CONTENT_TYPE_LATEST
    return generate_latest(metrics.registry)


def _add_docs(app: bottle.Bottle, root: str) -> None:
    """/openapi.json and friends, generated once from ROUTES; /docs renders them with the
    vendored Swagger UI (no network needed)."""
    doc = openapi.document(ROUTES, SCHEMAS, FAILURES)
    older = openapi.downgrade(doc)
    bodies = {
        "/openapi.json": (json.dumps(doc, indent=1).encode(), "application/json"),
        "/openapi-3.0.json": (json.dumps(older, indent=1).encode(), "application/json"),
        "/openapi.yaml": (yaml.safe_dump(doc, sort_keys=False).encode(),
                          "application/yaml"),
        "/openapi-3.0.yaml": (yaml.safe_dump(older, sort_keys=False).encode(),
                              "application/yaml"),
    }
    for path, (body, ctype) in bodies.items():
        def serve(body: bytes = body, ctype: str = ctype) -> bytes:
            bottle.response.content_type = ctype
            return body
        app.route(path, "GET", serve)
    app.route("/docs", "GET", lambda: bottle.static_file("docs.html", root=root))


def _add_static(app: bottle.Bottle, root: str) -> None:
    index = os.path.join(root, "index.html")

    def asset(path: str) -> Any:
        return bottle.static_file(path, root=os.path.join(root, "assets"))

    def spa(path: str = "") -> Any:
        return bottle.static_file("index.html", root=root) if os.path.exists(index) \
            else _plain("DOQ")

    app.route("/assets/<path:path>", "GET", asset)
    # the pages the web UI routes itself (webui/assets/app.js); any other path is a 404
    # problem, so that a mistyped API path is never answered 200 with the UI's page
    for page in ("/", "/queues/<path:path>", "/servers", "/cluster"):
        app.route(page, "GET", spa)


class Middleware:
    """Probes first; then cross-site refusals and CORS, security headers, a request id and
    HTTP metrics on every response."""

    def __init__(self, app: bottle.Bottle, service: Service, metrics: Metrics | None,
                 auth: Authorizer | None = None) -> None:
        self.app = app
        self.service = service
        self.metrics = metrics
        self.auth = auth or Authorizer(None, None)

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/livez":
            return self._probe(start_response, True, "OK")
        if path == "/readyz":
            return self._probe(start_response, *self.service.readiness())
        cors = self.auth.cors_headers(environ)
        if cors and environ.get("REQUEST_METHOD") == "OPTIONS":
            start_response("204 No Content", cors + SECURITY_HEADERS)
            return [b""]
        refused = self.auth.cross_site_problem(environ)
        if refused:
            denied = problem_body(403, "cross-origin request refused",
                                  [{"message": refused, "location": "header.Origin"}],
                                  "permission_denied")
            start_response("403 Forbidden", [("Content-Type", "application/problem+json"),
                                              ("Content-Length", str(len(denied)))]
                           + SECURITY_HEADERS)
            return [denied]
        started = time.perf_counter()
        seen: list[str] = []

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            headers.extend(cors)
            headers.extend(SECURITY_HEADERS)
            headers.append(("X-Request-Id", new_request_id()))
            seen.append(status)
            return start_response(status, headers, exc_info)

        gauge = self.metrics.in_progress(environ.get("REQUEST_METHOD", "")) \
            if self.metrics is not None and path != "/metrics" else None
        if gauge is not None:
            gauge.inc()
        try:
            body = self._dispatch(environ, start)
        finally:
            if gauge is not None:
                gauge.dec()
        if seen and path != "/metrics":
            elapsed = time.perf_counter() - started
            if self.metrics is not None:
                route = environ.get("bottle.route")
                template = route.rule if route is not None else "<unmatched>"
                self.metrics.observe_http(environ["REQUEST_METHOD"], template,
                                          int(seen[0][:3]), elapsed)
            if access_log.isEnabledFor(logging.DEBUG):
                access_log.debug("%s %s %s %.2fms", environ["REQUEST_METHOD"], path,
                                 seen[0][:3], elapsed * 1e3)
        return body

    def _dispatch(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        """An API route: its handler, called directly; anything else: Bottle."""
        # Bottle routes on the path as UTF-8 (PEP 3333 hands it over as latin-1).
        path = environ.get("PATH_INFO", "") or "/"
        decoded = path.encode("latin1").decode("utf8", "ignore")
        try:
            route, args = self.app.router.match(
                {"PATH_INFO": decoded, "REQUEST_METHOD": environ.get("REQUEST_METHOD", "GET")})
        except bottle.HTTPError:
            route = None                        # Bottle answers 404 / 405 its way
        handler = self.app.doq_api.get(route.name) if route is not None else None
        if handler is None:
            return self.app(environ, start)     # type: ignore[no-any-return]
        environ["bottle.raw_path"], environ["PATH_INFO"] = path, decoded
        environ["bottle.route"] = route
        call, body = _call_api(environ, handler, args)
        status = call.status
        start(f"{status} {bottle.HTTP_CODES.get(status, 'Unknown')}",
              call.response_headers(body))
        return [body] if isinstance(body, bytes) else body

    @staticmethod
    def _probe(start_response: Callable[..., Any], ok: bool, text: str) -> list[bytes]:
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8")])
        return [text.encode()]

