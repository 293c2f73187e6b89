"""The OpenAPI description (generated from the registered routes) and the /docs page, the
latter opened in headless Chromium with no access beyond loopback."""
from __future__ import annotations

import json
import os
import shutil
import urllib.parse
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from doq_lib import rules
from doq_lib.http import FAILURES, ROUTES, openapi
from doq_lib.http.schema import SCHEMAS
from tests.harness import REPO, Cluster

pytestmark = pytest.mark.timeout(180)
ARTIFACTS = Path(REPO) / "tests" / "artifacts"

# SPEC §3.2: method, path, operation id
SPEC_ROUTES = [
    ("POST", "/API/v1/cluster/join", "cluster-join"),
    ("POST", "/API/v1/cluster/leave", "cluster-leave"),
    ("GET", "/API/v1/cluster/servers", "cluster-servers"),
    ("POST", "/db/backup", "db-backup"),
    ("POST", "/db/restore", "db-restore"),
    ("POST", "/API/v1/ids", "generate-id"),
    ("POST", "/API/v1/queues", "create-queue"),
    ("GET", "/API/v1/queues", "queues"),
    ("GET", "/API/v1/queues/{queue_name}", "queue-info"),
    ("PUT", "/API/v1/queues/{queue_name}", "update-queue"),
    ("DELETE", "/API/v1/queues/{queue_name}", "delete-queue"),
    ("POST", "/API/v1/queues/{queue_name}/messages", "enqueue"),
    ("GET", "/API/v1/queues/{queue_name}/messages", "dequeue"),
    ("GET", "/API/v1/queues/{queue_name}/messages/{id}", "get"),
    ("DELETE", "/API/v1/queues/{queue_name}/messages/{id}", "delete"),
    ("POST", "/API/v1/queues/{queue_name}/messages/{id}/ack", "ack"),
    ("POST", "/API/v1/queues/{queue_name}/messages/{id}/nack", "nack"),
    ("POST", "/API/v1/queues/{queue_name}/messages/{id}/touch", "touch"),
    ("PUT", "/API/v1/queues/{queue_name}/messages/{id}/priority", "update-priority"),
]


def operations(doc: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {op["operationId"]: (method.upper(), path)
            for path, item in doc["paths"].items() for method, op in item.items()}


def test_every_registered_route_is_described_and_nothing_else() -> None:
    doc = openapi.document(ROUTES, SCHEMAS, FAILURES)
    ops = operations(doc)
    registered = {op_id: (method, openapi.openapi_path(rule))
                  for method, rule, op_id, _ in ROUTES}
    assert ops == registered
    for method, path, op_id in SPEC_ROUTES:
        assert ops[op_id] == (method, path)
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["title"] == "DOQ a distributed priority queue servie"
    assert doc["info"]["version"] == "1.0.0"
    assert {d.tag for d in openapi.ROUTE_DOCS.values()} == set(openapi.TAGS)
    for item in doc["paths"].values():
        for op in item.values():
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                ref = body["schema"]["$ref"].rsplit("/", 1)[1]
                assert doc["components"]["schemas"][ref] == SCHEMAS[ref]
            for status, response in op["responses"].items():
                assert response["description"], (op["operationId"], status)
    enqueue = doc["paths"]["/API/v1/queues/{queue_name}/messages"]["post"]
    assert enqueue["responses"]["409"]["description"] == "Failed to enqueue a message"
    assert [p["name"] for p in enqueue["parameters"]] == ["queue_name"]
    dequeue = doc["paths"]["/API/v1/queues/{queue_name}/messages"]["get"]
    assert {p["name"]: p["in"] for p in dequeue["parameters"]} == {
        "queue_name": "path", "ack": "query", "count": "query", "wait": "query",
        "browse": "query", "state": "query", "group": "query", "after": "query",
        "limit": "query", "consumer": "query"}
    ack = doc["paths"]["/API/v1/queues/{queue_name}/messages/{id}/ack"]["post"]
    assert [p["name"] for p in ack["parameters"]] == ["queue_name", "id", "delivery"]
    assert ack["requestBody"]["required"] is False            # the original ignores a body
    for route in ("ack", "nack", "touch", "reject"):
        fenced = doc["paths"][f"/API/v1/queues/{{queue_name}}/messages/{{id}}/{route}"]["post"]
        assert fenced["responses"]["409"]["description"].startswith("stale_delivery"), route


def test_a_route_without_docs_is_an_error() -> None:
    with pytest.raises(KeyError, match="no entry in ROUTE_DOCS"):
        openapi.document([("GET", "/x", "mystery", "x")], SCHEMAS, {})


def test_the_3_0_variant_has_no_type_lists() -> None:
    doc = openapi.downgrade(openapi.document(ROUTES, SCHEMAS, FAILURES))
    assert doc["openapi"] == "3.0.3"
    text = json.dumps(doc)
    assert '"null"' not in text
    nack = doc["components"]["schemas"]["NackInputBody"]["properties"]["metadata"]
    assert nack["type"] == "object" and nack["nullable"] is True


def test_the_metadata_limits_are_described_in_both_variants() -> None:
    newer = openapi.document(ROUTES, SCHEMAS, FAILURES)
    metadata = newer["components"]["schemas"]["EnqueueInputBody"]["properties"]["metadata"]
    assert metadata["maxProperties"] == rules.MAX_METADATA
    assert metadata["propertyNames"]["maxLength"] == rules.MAX_METADATA_KEY
    assert metadata["additionalProperties"]["maxLength"] == rules.MAX_METADATA_VALUE
    older = openapi.downgrade(newer)
    assert "propertyNames" not in json.dumps(older)       # not in OpenAPI 3.0
    metadata = older["components"]["schemas"]["EnqueueInputBody"]["properties"]["metadata"]
    assert f"1 to {rules.MAX_METADATA_KEY} characters" in metadata["description"]
    assert "x-dead-*" in metadata["description"]           # the server's own keys, refused


def test_the_group_rule_and_the_slowest_group_rate_are_described() -> None:
    doc = openapi.document(ROUTES, SCHEMAS, FAILURES)
    schemas = doc["components"]["schemas"]
    group = schemas["EnqueueInputBody"]["properties"]["group"]
    assert group["maxLength"] == rules.MAX_GROUP
    assert f"at most {rules.MAX_GROUP_DEPTH} non-empty labels" in group["description"]
    rate = json.dumps(doc)
    assert f"at least {rules.MIN_GROUP_RATE:.4g}" in rate


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    c = Cluster(str(tmp_path_factory.mktemp("docs")), size=1).start()
    try:
        yield c.nodes[0]
    finally:
        c.stop()


def test_served_descriptions(node: Any) -> None:
    http = node.http()
    served = http.get("/openapi.json")
    assert served.status == 200 and served.headers["content-type"].startswith(
        "application/json")
    assert served.json() == openapi.document(ROUTES, SCHEMAS, FAILURES)
    as_yaml = http.get("/openapi.yaml")
    assert as_yaml.status == 200 and yaml.safe_load(as_yaml.body) == served.json()
    assert yaml.safe_load(http.get("/openapi-3.0.yaml").body)["openapi"] == "3.0.3"
    assert http.get("/openapi-3.0.json").json()["openapi"] == "3.0.3"
    page = http.get("/docs")
    assert page.status == 200 and b"swagger-ui-bundle.js" in page.body
    asset = http.get("/assets/vendor/swagger-ui/swagger-ui-bundle.js")
    assert asset.status == 200 and len(asset.body) > 100_000


def test_docs_page_lists_every_operation_in_chromium(node: Any) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "the browser tests need Debian's chromium (.ci/run installs it)"
    from playwright.sync_api import sync_playwright

    base = f"http://{node.host}:{node.http_port}"
    outside: list[str] = []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def only_loopback(route: Any) -> None:
        host = urllib.parse.urlsplit(route.request.url).hostname or ""
        if host in ("127.0.0.1", "localhost") or route.request.url.startswith("data:"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium,
                                    args=["--no-sandbox", "--disable-gpu"])
        try:
            for name, width in (("docs-1280", 1280), ("docs-narrow", 420)):
                page = browser.new_page(viewport={"width": width, "height": 800})
                errors: list[str] = []
                page.on("pageerror", lambda exc, errors=errors: errors.append(str(exc)))
                page.route("**/*", only_loopback)
                page.goto(base + "/docs")
                page.wait_for_selector(".opblock", timeout=30_000)
                title = page.locator(".info .title").inner_text()
                assert "DOQ a distributed priority queue servie" in title
                shown = {(b.get_attribute("class") or "", b.locator(
                    ".opblock-summary-path").get_attribute("data-path"))
                    for b in page.locator(".opblock").all()}
                found = {(m, path) for cls, path in shown for m in
                         ("get", "post", "put", "delete") if f"opblock-{m}" in cls}
                for method, path, _ in SPEC_ROUTES:
                    assert (method.lower(), path) in found, (method, path)
                page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=False)
                assert not errors, errors
                page.close()
        finally:
            browser.close()
    assert not outside, f"the page tried to reach beyond loopback: {outside}"
    assert os.path.getsize(ARTIFACTS / "docs-1280.png") > 10_000


def test_the_writes_that_grow_the_data_document_507() -> None:
    doc = openapi.document(ROUTES, SCHEMAS, FAILURES)
    with_507 = {op["operationId"] for methods in doc["paths"].values()
                for op in methods.values() if "507" in op["responses"]}
    assert with_507 == set(openapi.GROWING)
