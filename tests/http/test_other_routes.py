"""Routes beside the API: HEAD, probes, security headers and request ids, unknown paths, /metrics
(SPEC §3.1, §3.5, §10)."""
from __future__ import annotations

import uuid

from tests.harness import Http
from tests.http.shapes import (
    SECURITY_HEADERS,
    counts,
    create,
    dequeue,
    enqueue,
    ok,
    problem,
    unique,
)


# == non-API routes, headers, metrics (SPEC §3.1, §3.5, §10) ====================================
def test_head_never_dequeues(http: Http) -> None:
    name = unique("head")
    create(http, name)
    mid = enqueue(http, name)["id"]
    for query in ("?ack=true", "?ack=false", ""):
        resp = http.request("HEAD", f"/API/v1/queues/{name}/messages{query}")
        assert resp.status == 405 and resp.body == b""
        assert resp.headers.get("allow") == "GET"
    assert counts(http, name) == (1, 0, 1)
    assert http.request("HEAD", f"/API/v1/queues/{name}").status == 200
    assert http.request("HEAD", f"/API/v1/queues/{name}/messages/{mid}").status == 200
    assert counts(http, name) == (1, 0, 1)
    assert dequeue(http, name, ack=True)["id"] == mid


def test_probes_and_health(http: Http) -> None:
    for path in ("/readyz", "/livez"):
        resp = http.get(path)
        assert (resp.status, resp.body) == (200, b"OK")
        assert "x-request-id" not in resp.headers           # answered before the middleware
    resp = http.get("/healthz")
    assert (resp.status, resp.body) == (200, b"OK")


def test_security_headers_and_request_id(http: Http) -> None:
    name = unique("hdr")
    create(http, name)
    responses = [
        http.get("/API/v1/queues"), http.get(f"/API/v1/queues/{name}"),
        http.get(f"/API/v1/queues/{name}/messages"),                         # a problem
        http.post(f"/API/v1/queues/{name}/messages", raw=b"{"),             # validation
        http.get("/healthz"), http.get("/metrics"), http.get("/some/page"),
        http.post("/no/such/path", {}),
    ]
    request_ids = set()
    for resp in responses:
        for header, value in SECURITY_HEADERS.items():
            assert resp.headers.get(header) == value, (header, resp.status, resp.headers)
        assert "content-security-policy" not in resp.headers
        assert "permissions-policy" not in resp.headers
        request_id = uuid.UUID(resp.headers["x-request-id"])
        assert request_id.version == 4 and request_id.variant == uuid.RFC_4122
        assert str(request_id) == resp.headers["x-request-id"]
        request_ids.add(str(request_id))
    assert len(request_ids) == len(responses)


def test_unknown_paths(http: Http) -> None:
    for path in ("/", "/queues/x", "/servers", "/cluster"):      # the web UI's own pages
        resp = http.get(path)
        assert resp.status == 200 and resp.headers["content-type"].startswith("text/html")
        assert b"<html" in resp.body.lower()
    for path in ("/API/v1/nothing/here", "/internal/nope", "/no/such/path"):
        problem(http.get(path), 404, "Not Found")           # not the UI's page
    for method in ("POST", "PUT", "DELETE"):
        problem(http.request(method, "/no/such/path"), 404, "Not Found")
        problem(http.request(method, "/API/v1/nothing"), 404, "Not Found")
    # a known path with another method stays 405
    problem(http.put("/API/v1/ids", {"number": 1}), 405, "Method Not Allowed")
    problem(http.delete("/API/v1/queues"), 405, "Method Not Allowed")


def test_metrics(http: Http) -> None:
    name = unique("metrics")
    create(http, name)
    for _ in range(3):
        enqueue(http, name)
    mid = dequeue(http, name)["id"]
    ok(http.post(f"/API/v1/queues/{name}/messages/{mid}/ack"))
    dequeue(http, name)
    resp = http.get("/metrics")
    assert resp.status == 200 and resp.headers["content-type"].startswith("text/plain")
    text = resp.body.decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    q = f'{{queue_name="{name}"}}'
    assert samples[f"doq_queues_enqueue_total{q}"] == 3
    assert samples[f"doq_queues_dequeue_total{q}"] == 2
    assert samples[f"doq_queues_ack_total{q}"] == 1
    assert samples[f"doq_queues_nack_total{q}"] == 0
    assert samples[f"doq_queues_messages{q}"] == 2
    assert samples[f"doq_queues_unacked_messages{q}"] == 1
    assert samples[f"doq_queues_ready_messages{q}"] == 1
    http_lines = [k for k in samples if k.startswith("doq_http_requests_total{")]
    template = 'path="/API/v1/queues/<queue_name>/messages"'
    assert any(template in k and 'method="POST"' in k and 'status_code="200"' in k
               and 'service="doq"' in k for k in http_lines), http_lines
    assert not any(name in k for k in http_lines)             # templates, not raw paths
    assert not any('path="/metrics"' in k for k in http_lines)
    assert any(k.startswith("doq_http_request_duration_seconds_bucket{") for k in samples)
