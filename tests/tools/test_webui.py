"""The admin UI in headless Chromium (Debian's, driven by playwright) against a real 3-node
cluster: queues, one queue's message actions, settings, errors, the cluster page.
Screenshots of every page, wide and narrow, go to tests/artifacts/ (git-ignored)."""
from __future__ import annotations

import re
import shutil
import time
import urllib.parse
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.harness import REPO, Cluster, NodeProc
from tests.harness import wait_until as _wait_until

pytestmark = pytest.mark.timeout(240)
ARTIFACTS = Path(REPO) / "tests" / "artifacts"
SIZES = {"wide": (1280, 800), "narrow": (390, 844)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("webui")))
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "the browser tests need Debian's chromium (.ci/run installs it)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


_current: list[Any] = []


def _describe_page() -> str:
    """What the page showed when a wait failed (the last page opened)."""
    if not _current:
        return ""
    try:
        page = _current[-1]
        banner = page.locator("#banner")
        return (f"\n--- page {page.url}\nbanner: "
                f"{banner.inner_text() if banner.is_visible() else '-'}\n"
                f"{page.locator('#view').inner_text()[:3000]}")
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        return f"(page not readable: {exc!r})"


def wait_until(predicate: Any, timeout: float = 15.0) -> Any:
    return _wait_until(predicate, timeout, describe=_describe_page)


class Page:
    """A browser page on one node that refuses to go beyond loopback and records JS errors."""

    def __init__(self, browser: Any, node: NodeProc, size: str = "wide") -> None:
        width, height = SIZES[size]
        self.page = browser.new_page(viewport={"width": width, "height": height})
        _current.append(self.page)
        self.base = f"http://{node.host}:{node.http_port}"
        self.errors: list[str] = []
        self.outside: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.route("**/*", self._only_loopback)

    def _only_loopback(self, route: Any) -> None:
        host = urllib.parse.urlsplit(route.request.url).hostname or ""
        if host in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            self.outside.append(route.request.url)
            route.abort()

    def open(self, path: str) -> Any:
        self.page.goto(self.base + path)
        return self.page

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"webui-{name}.png"), full_page=True)

    def close(self) -> None:
        assert not self.errors, self.errors
        assert not self.outside, f"the page tried to reach beyond loopback: {self.outside}"
        self.page.close()


def cell(page: Any, queue: str, column: str) -> Any:
    return page.locator(f'tr[data-queue="{queue}"] td[data-col="{column}"]')


def card(page: Any, key: str) -> Any:
    return page.locator(f'[data-card="{key}"] .value')


def test_queues_and_messages_end_to_end(cluster: Cluster, browser: Any) -> None:
    node = cluster.followers()[0]                          # any node will do
    ui = Page(browser, node)
    page = ui.open("/")
    assert page.title() == "DOQ - Distributed ordered queue"
    page.wait_for_selector("#queues")

    # create: a server-side validation error is shown at its field, nothing is created
    page.click("#new-queue")
    page.fill('#create-queue [name="name"]', "jobs")
    page.select_option('#create-queue [name="type"]', "fair")
    page.select_option('#create-queue [name="strategy"]', "weighted")
    page.fill('#create-queue [name="ack_timeout"]', "5")
    page.click('#create-queue button[type="submit"]')
    error = page.locator('#create-queue [data-error-for="ack_timeout"]')
    error.wait_for()
    wait_until(lambda: "60" in error.inner_text(), 10)
    assert page.locator('tr[data-queue="jobs"]').count() == 0
    page.fill('#create-queue [name="ack_timeout"]', "600")
    page.click('#create-queue button[type="submit"]')
    page.wait_for_selector('tr[data-queue="jobs"]')
    assert "created" in page.locator("#queues-flash").inner_text()
    row = page.locator('tr[data-queue="jobs"]').inner_text()
    assert "fair" in row and "weighted" in row and "ack 600s" in row

    # a second queue to filter and sort
    page.click("#new-queue")
    page.fill('#create-queue [name="name"]', "alpha")
    page.click('#create-queue button[type="submit"]')
    page.wait_for_selector('tr[data-queue="alpha"]')
    # creating it again changes nothing, and the page says so
    page.click("#new-queue")
    page.fill('#create-queue [name="name"]', "alpha")
    page.select_option('#create-queue [name="type"]', "fair")
    page.click('#create-queue button[type="submit"]')
    wait_until(lambda: "exists already: nothing changed (it is delayed)"
               in page.locator("#queues-flash").inner_text(), 10)
    page.fill("#filter", "jo")
    wait_until(lambda: page.locator("#queues tbody tr").count() == 1, 5)
    page.fill("#filter", "")
    page.click('th[data-key="name"]')                        # descending
    wait_until(lambda: page.locator("#queues tbody tr").first.get_attribute("data-queue")
               == "jobs", 5)
    ui.shot("queues-wide")

    # one queue: enqueue three messages, see the counts move
    page.click('tr[data-queue="jobs"] a')
    page.wait_for_selector("#enqueue")
    assert page.locator("#queue-name").inner_text() == "jobs"
    assert "null" not in page.locator("h1").inner_text()
    enqueued = page.locator('[data-result="enqueue"]')
    for i in range(3):
        page.fill('#enqueue [name="content"]', f"job-{i}")
        page.fill('#enqueue [name="group"]', f"customer-{i % 2}")
        page.fill('#enqueue [name="priority"]', str(5 + i))
        if i == 0:
            page.fill('#enqueue [name="metadata"]', "source=ui\nattempt=1")
        page.click('#enqueue button[type="submit"]')
        wait_until(lambda: "Enqueued id" in enqueued.inner_text(), 10)
        enqueued.evaluate("el => el.textContent = ''")
    wait_until(lambda: card(page, "ready").inner_text() == "3", 10)
    wait_until(lambda: card(page, "total").inner_text() == "3", 10)

    # dequeue without ack, then ack it
    page.click("#dequeue button")
    page.wait_for_selector("#message .message")
    first = page.locator('#message [data-field="id"]').inner_text()
    assert page.locator('#message [data-field="content"]').inner_text().startswith("job-")
    wait_until(lambda: card(page, "unacked").inner_text() == "1", 10)
    # the queue's consumers: the admin UI holds it now
    wait_until(lambda: page.locator('#consumers [data-consumer="admin-ui"] [data-field="held"]')
               .count() == 1 and page.locator('#consumers [data-consumer="admin-ui"] '
                                              '[data-field="held"]').inner_text() == "1", 10)
    # the delivery's token is shown, and the buttons settle only that delivery
    token = page.locator('#message [data-field="delivery"]').inner_text()
    assert token.startswith(f"{first}-1-")
    page.click('#message [data-action="Ack"]')
    wait_until(lambda: page.locator("#message-result").inner_text() == "Acknowledged.", 10)
    wait_until(lambda: card(page, "total").inner_text() == "2", 10)
    wait_until(lambda: page.locator('#consumers [data-consumer="admin-ui"] [data-field="acks"]')
               .inner_text() == "1", 10)
    # acking again is a server error, shown in place: the message is gone
    page.click('#message [data-action="Ack"]')
    wait_until(lambda: "Message not found" in page.locator("#message-result").inner_text(), 10)
    assert "form-error" in (page.locator("#message-result").get_attribute("class") or "")

    # dequeue, touch, nack: the message goes back to ready
    page.click("#dequeue button")
    wait_until(lambda: page.locator('#message [data-field="id"]').inner_text() != first, 10)
    second = page.locator('#message [data-field="id"]').inner_text()
    page.click('#message [data-action="Touch"]')
    wait_until(lambda: "extended" in page.locator("#message-result").inner_text(), 10)
    page.click('#message [data-action="Nack"]')
    wait_until(lambda: "back to the queue" in page.locator("#message-result").inner_text(), 10)
    wait_until(lambda: card(page, "ready").inner_text() == "2"
               and card(page, "unacked").inner_text() == "0", 10)

    # look up by id, change its priority, delete it
    page.fill('#lookup [name="lookup"]', second)
    page.click("#lookup button")
    wait_until(lambda: page.locator('#message [data-field="state"]').inner_text() == "stored"
               and page.locator('#message [data-field="id"]').inner_text() == second, 10)
    page.fill('#message [name="new_priority"]', "42")
    page.click('#message [data-action="Set priority"]')
    wait_until(lambda: "Priority is now 42" in page.locator("#message-result").inner_text(), 10)
    assert node.http().get(f"/API/v1/queues/jobs/messages/{second}").json()["priority"] == 42
    page.click('#message [data-action="Delete"]')
    wait_until(lambda: page.locator("#message-result").inner_text() == "Deleted.", 10)
    wait_until(lambda: card(page, "total").inner_text() == "1", 10)
    assert node.http().get(f"/API/v1/queues/jobs/messages/{second}").status == 400
    # an unknown id: the server's message is shown
    page.fill('#lookup [name="lookup"]', "12345")
    page.click("#lookup button")
    lookup_error = page.locator("#lookup .form-error")
    wait_until(lambda: "Failed to get a message" in lookup_error.inner_text(), 10)

    # settings: a bad value is refused in place, a good one is saved
    page.fill('#settings [name="ack_timeout"]', "1")
    page.click('#settings button[type="submit"]')
    wait_until(lambda: page.locator('#settings [data-error-for="ack_timeout"]').inner_text() != "",
               10)
    page.fill('#settings [name="ack_timeout"]', "900")
    page.fill('#settings [name="max_unacked"]', "3")
    page.click('#settings button[type="submit"]')
    wait_until(lambda: page.locator('[data-result="settings"]').inner_text() == "Saved.", 10)
    wait_until(lambda: "ack 900s" in page.locator("#queue-badges").inner_text(), 10)
    settings = node.http().get("/API/v1/queues/jobs").json()["settings"]
    assert settings["ack_timeout"] == 900 and settings["max_unacked"] == 3
    ui.shot("queue-wide")

    # the rates and their sparklines are there
    assert page.locator("[data-card] svg").count() == 7
    # delete the queue from the list, with confirmation
    page.click('a[data-nav="queues"]')
    page.wait_for_selector('tr[data-queue="alpha"]')
    page.click('[data-delete="alpha"]')
    page.click("#confirm-ok")
    wait_until(lambda: page.locator('tr[data-queue="alpha"]').count() == 0, 10)
    assert node.http().get("/API/v1/queues/alpha").status == 400
    ui.close()


def test_retries_and_dead_letters(cluster: Cluster, browser: Any) -> None:
    """The message lifecycle in the UI: its settings in the create and settings forms and as
    badges, deliveries and the last error in the message panel, reject, the DLQ mark in the list,
    and redrive on the dead-letter queue's page."""
    node = cluster.followers()[0]
    http = node.http()
    ui = Page(browser, node)
    page = ui.open("/")
    page.wait_for_selector("#queues")
    # create the DLQ, then a queue that uses it, with the create form's lifecycle fields
    for name, dlq in (("poison", ""), ("orders", "poison")):
        page.click("#new-queue")
        page.fill('#create-queue [name="name"]', name)
        if dlq:
            page.click("#create-lifecycle summary")
            page.fill('#create-queue [name="max_deliveries"]', "2")
            page.fill('#create-queue [name="dead_letter_queue"]', dlq)
        page.click('#create-queue button[type="submit"]')
        page.wait_for_selector(f'tr[data-queue="{name}"]')
    settings = http.get("/API/v1/queues/orders").json()["settings"]
    assert (settings["max_deliveries"], settings["dead_letter_queue"]) == (2, "poison")
    wait_until(lambda: page.locator('[data-dlq="poison"]').count() == 1, 10)
    assert page.locator('[data-dlq="orders"]').count() == 0
    row = page.locator('tr[data-queue="orders"]').inner_text()
    assert "max deliveries 2" in row and "DLQ → poison" in row
    ui.shot("dlq-list")

    # a message that fails once (nack with an error), then is rejected from the UI
    mid = http.post("/API/v1/queues/orders/messages", {"content": "bad order",
                                                       "priority": 1}).json()["id"]
    http.get("/API/v1/queues/orders/messages?ack=false")
    http.post(f"/API/v1/queues/orders/messages/{mid}/nack", {"priority": 0,
                                                            "error": "card declined"})
    page.click('tr[data-queue="orders"] a')
    page.wait_for_selector("#dequeue")
    page.click("#dequeue button")
    page.wait_for_selector('#message [data-field="deliveries"]')
    assert page.locator('#message [data-field="deliveries"]').inner_text() == "2"
    assert page.locator('#message [data-field="last_error"]').inner_text() == "card declined"
    page.click('#message [data-action="Reject"]')
    wait_until(lambda: page.locator("#message-result").inner_text() == "Dead-lettered.", 10)
    dead = http.get(f"/API/v1/queues/poison/messages/{mid}").json()
    assert dead["metadata"]["x-dead-reason"] == "rejected"
    # the settings form: lifecycle fields, saved
    page.fill('#settings [name="message_ttl"]', "3600")
    page.select_option('#settings [name="overflow"]', "drop_oldest")
    page.fill('#settings [name="max_messages"]', "500")
    page.click('#settings button[type="submit"]')
    wait_until(lambda: page.locator('[data-result="settings"]').inner_text() == "Saved.", 10)
    wait_until(lambda: "TTL 3600s" in page.locator("#queue-badges").inner_text(), 10)
    settings = http.get("/API/v1/queues/orders").json()["settings"]
    assert (settings["message_ttl"], settings["max_messages"], settings["overflow"],
            settings["dead_letter_queue"]) == (3600, 500, "drop_oldest", "poison")
    ui.shot("dlq-queue")

    # the DLQ's page offers a redrive; it moves the message back
    page.click('a[data-nav="queues"]')
    page.wait_for_selector('tr[data-queue="poison"] a')
    page.click('tr[data-queue="poison"] a')
    page.wait_for_selector("#redrive")
    assert "orders" in page.locator("#redrive").inner_text()
    page.click('#redrive button[type="submit"]')
    wait_until(lambda: page.locator('[data-result="redrive"]').inner_text() == "Moved 1.", 10)
    back = http.get(f"/API/v1/queues/orders/messages/{mid}").json()
    assert back["deliveries"] == 0 and "x-dead-reason" not in back.get("metadata", {})
    ui.shot("dlq-redrive")
    ui.close()


def test_operator_controls(cluster: Cluster, browser: Any) -> None:
    """Operator controls in the UI: pause / resume, a group's pause in the groups table, browse with
    paging, explain in the message panel, purge with confirmation, the paused mark in the
    list."""
    node = cluster.followers()[0]
    http = node.http()
    http.post("/API/v1/queues", {"name": "tenants", "type": "fair"})
    for n in range(25):
        group = ("a", "a.b", "b")[n % 3]
        http.post("/API/v1/queues/tenants/messages", {"content": f"job {n}", "priority": 1,
                                                      "group": group})
    ui = Page(browser, node)
    page = ui.open("/queues/tenants")
    page.wait_for_selector("#controls #pause-toggle")
    wait_until(lambda: page.locator("#pause-toggle").inner_text() == "Pause", 10)
    page.click("#pause-toggle")
    wait_until(lambda: page.locator("#paused-badge").count() == 1, 10)
    assert http.get("/API/v1/queues/tenants").json()["paused"] is True
    assert page.locator("#pause-toggle").inner_text() == "Resume"
    # the groups table: pause a, which covers a.b
    page.wait_for_selector('#groups tr[data-group="a"] button')
    page.click('#groups tr[data-group="a"] button')
    wait_until(lambda: "paused by a" in page.locator(
        '#groups tr[data-group="a.b"]').inner_text(), 10)
    assert page.locator('#groups tr[data-group="a"] button').inner_text() == "Resume"
    groups = {g["group"]: g for g in http.get("/API/v1/queues/tenants/groups").json()["groups"]}
    assert groups["a"]["paused"] and groups["a.b"]["paused_by"] == "a"
    assert not groups["b"]["paused"]
    ui.shot("controls-paused")
    page.click("#pause-toggle")                                      # resume the queue
    wait_until(lambda: page.locator("#paused-badge").count() == 0, 10)
    assert "null" not in page.locator("#queue-badges").inner_text()
    # browse two pages (20, then 5), nothing taken
    page.click('#browse button[type="submit"]')
    wait_until(lambda: page.locator("#browse tr[data-browsed]").count() == 20, 10)
    page.click("#browse-next")
    wait_until(lambda: page.locator("#browse tr[data-browsed]").count() == 5
               and page.locator("#browse-page").inner_text() == "page 2", 10)
    assert page.locator("#browse-next").is_hidden()
    assert http.get("/API/v1/queues/tenants").json()["ready"] == 25
    # a message of the paused group: explain says why it waits
    a_id = next(g for g in http.get(
        "/API/v1/queues/tenants/messages?browse=true&group=a&limit=1").json()["messages"])["id"]
    page.fill("#lookup input", a_id)
    page.click("#lookup button")
    page.wait_for_selector('#message [data-action="Explain"]')
    page.click('#message [data-action="Explain"]')
    wait_until(lambda: "group a is paused" in page.locator("#message-result").inner_text(), 10)
    ui.shot("controls-explain")
    # purge, the unacked ones too, after confirming
    http.get("/API/v1/queues/tenants/messages?ack=false")
    page.check("#purge-unacked")
    page.click("#purge")
    page.click("#confirm-ok")
    wait_until(lambda: page.locator('[data-result="controls"]').inner_text()
               == "Purged 25 messages.", 10)
    assert http.get("/API/v1/queues/tenants").json()["total"] == 0
    # the list marks a paused queue
    http.post("/API/v1/queues/tenants/pause")
    page.click('a[data-nav="queues"]')
    wait_until(lambda: page.locator('[data-paused="tenants"]').count() == 1, 10)
    ui.shot("controls-list")
    http.post("/API/v1/queues/tenants/groups/a/resume")
    http.delete("/API/v1/queues/tenants")
    ui.close()


def test_schedules(cluster: Cluster, browser: Any) -> None:
    """A queue's schedules in the UI: add a cron one in a time zone and an every-second one,
    a refused cron shown in place, the fired count moving, pause / resume, delete after
    confirming."""
    node = cluster.followers()[0]
    http = node.http()
    http.post("/API/v1/queues", {"name": "timed", "type": "delayed"})
    ui = Page(browser, node)
    page = ui.open("/queues/timed")
    page.wait_for_selector("#schedule-form")
    form = "#schedule-form"

    def add(name: str, kind: str, when: str, zone: str = "") -> None:
        page.fill(f'{form} [name="name"]', name)
        page.select_option(f'{form} [name="kind"]', kind)
        page.fill(f'{form} [name="when"]', when)
        page.fill(f'{form} [name="timezone"]', zone)
        page.fill(f'{form} [name="content"]', f"{name} run")
        page.click(f'{form} button[type="submit"]')
    add("broken", "cron", "61 * * * *")
    wait_until(lambda: "cron" in page.locator("#schedule-error").inner_text(), 10)
    add("nightly", "cron", "30 2 * * *", "Europe/Berlin")
    page.wait_for_selector('#schedules tr[data-schedule="nightly"]')
    assert "30 2 * * * (Europe/Berlin)" in page.locator(
        '#schedules tr[data-schedule="nightly"]').inner_text()
    assert page.locator("#schedule-error").inner_text() == ""
    add("tick", "every", "1")
    page.wait_for_selector('#schedules tr[data-schedule="tick"]')
    wait_until(lambda: int(page.locator('#schedules tr[data-schedule="tick"] '
                                        '[data-field="fired"]').inner_text()) >= 2, 15)
    ui.shot("schedules")
    page.click('#schedules tr[data-schedule="tick"] [data-schedule-action="pause"]')
    wait_until(lambda: page.locator('#schedules tr[data-schedule="tick"] '
                                    '[data-schedule-action="resume"]').count() == 1, 10)
    assert http.get("/API/v1/queues/timed/schedules/tick").json()["paused"] is True
    page.click('#schedules tr[data-schedule="nightly"] [data-schedule-action="delete"]')
    page.click("#confirm-ok")
    wait_until(lambda: page.locator('#schedules tr[data-schedule="nightly"]').count() == 0, 10)
    assert [s["name"] for s in http.get("/API/v1/queues/timed/schedules").json()[
        "schedules"]] == ["tick"]
    assert http.get("/API/v1/queues/timed").json()["total"] >= 2
    http.delete("/API/v1/queues/timed")
    ui.close()


def test_narrow_screens(cluster: Cluster, browser: Any) -> None:
    node = cluster.nodes[0]
    http = node.http()
    http.post("/API/v1/queues", {"name": "narrow", "type": "delayed"})
    http.post("/API/v1/queues/narrow/messages", {"content": "x", "priority": 1})
    ui = Page(browser, node, "narrow")
    page = ui.open("/")
    page.wait_for_selector('tr[data-queue="narrow"]')
    ui.shot("queues-narrow")
    # the page does not scroll sideways, and the counts are in view without scrolling
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    box = cell(page, "narrow", "total").bounding_box()
    assert box is not None and box["x"] + box["width"] <= 390
    assert not page.locator('#create-queue [name="strategy"]').is_visible()
    page.click('tr[data-queue="narrow"] a')
    page.wait_for_selector("#enqueue")
    wait_until(lambda: card(page, "ready").inner_text() == "1", 10)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert "null" not in page.locator("h1").inner_text()
    # delayed delivery from a date and time (the browser's zone is the machine's)
    when = page.evaluate("""() => {
        const d = new Date(Date.now() + 3600 * 1000);
        const pad = (n) => String(n).padStart(2, "0");
        return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T` +
               `${pad(d.getHours())}:${pad(d.getMinutes())}`;
    }""")
    page.fill('#enqueue [name="content"]', "later")
    page.fill('#enqueue [name="deliver_at"]', when)
    page.click('#enqueue button[type="submit"]')
    wait_until(lambda: "Enqueued id" in page.locator('[data-result="enqueue"]').inner_text(), 10)
    mid = page.locator('[data-result="enqueue"]').inner_text().split()[-1].rstrip(".")
    got = http.get(f"/API/v1/queues/narrow/messages/{mid}").json()
    assert got["content"] == "later" and abs(got["priority"] - (time.time() + 3600)) < 120
    ui.shot("queue-narrow")
    page.click('a[data-nav="servers"]')
    page.wait_for_selector('tr[data-server]')
    ui.shot("cluster-narrow")
    ui.close()


def test_cluster_page_and_a_node_going_down(cluster: Cluster, browser: Any) -> None:
    leader = cluster.leader()
    follower = [n for n in cluster.nodes if n is not leader][-1]
    ui = Page(browser, follower)
    page = ui.open("/servers")
    wait_until(lambda: page.locator("tr[data-server]").count() == 3, 15)
    assert page.locator(".badge.leader").count() == 1
    leader_row = page.locator(f'tr[data-server="{leader.node_id}"]').inner_text()
    assert "leader" in leader_row and leader.raft_addr in leader_row
    wait_until(lambda: page.locator(".badge.ok").count() == 3, 15)
    assert f"leader {leader.node_id}" in page.locator("#leader-summary").inner_text()
    ui.shot("cluster-wide")

    # a follower goes down: the leader reports it unreachable
    other = next(n for n in cluster.nodes if n not in (leader, follower))
    other.kill()
    try:
        wait_until(lambda: page.locator(f'tr[data-server="{other.node_id}"] .badge.bad')
                   .count() == 1, 20)
        # and the node this page talks to goes down: a banner says so
        follower.kill()
        banner = page.locator("#banner")
        wait_until(lambda: banner.is_visible() and "Cannot reach" in banner.inner_text(), 15)
        ui.shot("node-down-wide")
        follower.start()
        wait_until(lambda: not banner.is_visible(), 30)
    finally:
        if not other.alive():
            other.start()
        if not follower.alive():
            follower.start()
        cluster.wait_ready(60)
    ui.close()


def test_no_leader_banner(tmp_path: Path, browser: Any) -> None:
    c = Cluster(str(tmp_path)).start()
    try:
        node = c.nodes[0]
        ui = Page(browser, node)
        page = ui.open("/")
        page.wait_for_selector("#queues")
        for other in c.nodes[1:]:
            other.kill()
        banner = page.locator("#banner")
        wait_until(lambda: banner.is_visible() and re.search(
            "not ready", banner.inner_text()) is not None, 30)
        assert "no quorum" in banner.inner_text() or "no leader" in banner.inner_text()
        # a write is refused with the server's 503 message, in place
        page.click("#new-queue")
        page.fill('#create-queue [name="name"]', "during-outage")
        page.click('#create-queue button[type="submit"]')
        wait_until(lambda: page.locator("#create-queue .form-error").inner_text() != "", 30)
        ui.shot("no-leader-wide")
        ui.close()
    finally:
        c.stop()


# -- over HTTPS, with API keys --------------------------------------------------------
def _spki_pin(cert_path: Path) -> str:
    """Chromium's --ignore-certificate-errors-spki-list value for one certificate."""
    import base64
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def test_over_https_the_page_asks_for_a_key_and_uses_it(
        tmp_path_factory: pytest.TempPathFactory, browser: Any) -> None:
    import ssl
    import subprocess
    import sys

    from tests.harness import DOQ, add_key

    root = tmp_path_factory.mktemp("webui-tls")
    certs, keys = root / "certs", root / "keys.yaml"
    assert subprocess.run([sys.executable, DOQ, "certs", f"--out={certs}"],
                          capture_output=True, timeout=60).returncode == 0

    admin, reader = add_key(keys, "ops", "admin"), add_key(keys, "viewer", "reader")
    c = Cluster(str(root), size=1, flags={"auth.keys_file": str(keys),
                                          "http.tls_cert": str(certs / "node.pem"),
                                          "http.tls_key": str(certs / "node-key.pem")})
    node = c.nodes[0]
    node.tls = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    node.admin_key = admin
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium
    c.start()
    try:
        # A second browser of the same playwright instance, trusting exactly this
        # node's certificate and nothing more.
        b = browser.browser_type.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu",
            f"--ignore-certificate-errors-spki-list={_spki_pin(certs / 'node.pem')}"])
        try:
            ui = Page(b, node)
            ui.base = f"https://127.0.0.1:{node.http_port}"
            page = ui.open("/")
            assert page.evaluate("location.protocol") == "https:"
            dialog = page.locator("#key-dialog")
            dialog.wait_for(state="visible")
            assert "needs an API key" in page.locator("#key-reason").inner_text()
            ui.shot("key-dialog")
            page.fill("#key-input", "doq_not-a-key")
            page.click("#key-save")
            wait_until(lambda: "refused" in page.locator("#key-reason").inner_text(), 10)
            page.fill("#key-input", reader)
            page.click("#key-save")
            page.wait_for_selector("#queues")
            assert page.locator("#key-button").inner_text() == "API key ✓"
            page.click("#new-queue")                  # a reader may not create queues
            page.fill('#create-queue [name="name"]', "secured")
            page.click('#create-queue button[type="submit"]')
            general = page.locator("#create-queue .form-error")
            wait_until(lambda: "may not administer" in general.inner_text(), 10)
            page.click("#key-button")                 # switch to the admin key
            page.fill("#key-input", admin)
            page.click("#key-save")
            page.wait_for_selector("#queues")
            page.click("#new-queue")
            page.fill('#create-queue [name="name"]', "secured")
            page.click('#create-queue button[type="submit"]')
            page.wait_for_selector('tr[data-queue="secured"]')
            assert page.evaluate("sessionStorage.getItem('doq-api-key')") == admin
            assert page.evaluate("localStorage.getItem('doq-api-key')") is None
            ui.shot("https-with-key")
            page.click("#key-button")
            page.click("#key-forget")
            dialog.wait_for(state="visible")          # the next request asks again
            assert page.evaluate("sessionStorage.getItem('doq-api-key')") is None
            ui.close()
        finally:
            b.close()
        listed = node.http().get("/API/v1/queues", headers=node.admin_headers()).json()
        assert [q["name"] for q in listed["queues"]] == ["secured"]
    finally:
        c.stop()


def _fits(page: Any, table: str, width: int) -> None:
    """``table`` needs no sideways scrolling, and every Delete button of it is inside both
    the viewport and the table's panel."""
    scroll, client = page.evaluate(f"""() => {{
        const t = document.querySelector('{table}');
        return [t.scrollWidth, t.parentElement.clientWidth]; }}""")
    assert scroll <= client, (table, width, scroll, client)
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    panel = page.locator(table).locator("xpath=..").bounding_box()
    buttons = page.locator(f"{table} [data-delete]")
    assert buttons.count() > 0
    for i in range(buttons.count()):
        box = buttons.nth(i).bounding_box()
        assert box is not None and box["width"] > 20
        assert box["x"] + box["width"] <= min(width, panel["x"] + panel["width"]), (width, box)


def test_the_queue_list_fits_and_the_queue_page_is_compact(cluster: Cluster,
                                                           browser: Any) -> None:
    """At 1280, 1920 and 390 px the queue list (with DLQ badges and every setting shown) has
    every Delete button in view without sideways scrolling. A queue's page: the settings form
    in columns, browse filled on open and after a dequeue, a paused column for groups, the
    priority box labelled, the new-queue form apart from the filter."""
    node = cluster.nodes[0]
    http = node.http()
    dlq, work = "layout-dead-letters-of-a-long-queue-name", "layout-customer-orders-processing"
    http.post("/API/v1/queues", {"name": dlq, "type": "delayed"})
    http.post("/API/v1/queues", {"name": work, "type": "fair", "settings": {
        "strategy": "weighted", "max_unacked": 5, "max_deliveries": 3, "dead_letter_queue": dlq,
        "max_messages": 1000, "message_ttl": 3600, "dedup_window": 60}})
    for i in range(3):
        http.post(f"/API/v1/queues/{work}/messages",
                  {"content": f"m{i}", "priority": 1, "group": f"g{i % 2}"})
    for width, height in ((1280, 800), (1920, 1080), (390, 844)):
        page = browser.new_page(viewport={"width": width, "height": height})
        try:
            page.goto(f"http://{node.host}:{node.http_port}/")
            page.wait_for_selector(f'tr[data-queue="{work}"]')
            page.wait_for_selector(f'[data-dlq="{dlq}"]', state="attached")
            _fits(page, "#queues", width)
            if width == 1280:
                page.click("#new-queue")
                filter_box = page.locator("#filter").bounding_box()
                form_box = page.locator("#create-queue").bounding_box()
                assert form_box["y"] >= filter_box["y"] + filter_box["height"] + 8
                page.screenshot(path=str(ARTIFACTS / "webui-queues-fit.png"))
        finally:
            page.close()

    ui = Page(browser, node)
    page = ui.open(f"/queues/{work}")
    page.wait_for_selector("#settings")
    # browse is filled on open
    wait_until(lambda: page.locator("#browse tr[data-browsed]").count() == 3, 10)
    # the settings form in columns: several fields share a row
    tops = [page.locator(f'#settings [name="{name}"]').bounding_box()["y"]
            for name in ("strategy", "max_unacked", "ack_timeout", "max_deliveries")]
    assert len({round(top) for top in tops}) < len(tops), tops
    # groups: a paused column
    page.wait_for_selector('#groups tr[data-group="g0"]')
    assert "PAUSED" in page.locator("#groups thead").inner_text().upper()
    assert page.locator('#groups tr[data-group="g0"] [data-field="paused"]').inner_text() == "no"
    # a dequeue moves the message to unacked in the browse list too
    page.click("#dequeue button")
    page.wait_for_selector('#message [data-field="id"]')
    taken = page.locator('#message [data-field="id"]').inner_text()
    wait_until(lambda: "unacked" in page.locator(
        f'#browse tr[data-browsed="{taken}"]').inner_text(), 10)
    # the priority box says what it is
    label = page.locator('#message label:has([name="new_priority"])')
    assert label.count() == 1 and label.inner_text().strip().lower() == "priority"
    page.click('#message [data-action="Ack"]')
    wait_until(lambda: page.locator("#browse tr[data-browsed]").count() == 2, 10)
    ui.shot("queue-compact")
    ui.close()


# For each text node of the element (the name's parts between <wbr>s): how many lines it
# takes; and how many lines the whole name takes.
_LINES_OF_PARTS = """(el) => {
    const parts = [...el.childNodes].filter((n) => n.nodeType === Node.TEXT_NODE);
    const lines = (node) => {
        const r = document.createRange(); r.selectNodeContents(node);
        return new Set([...r.getClientRects()].map((b) => Math.round(b.top))).size; };
    return [parts.map((p) => [p.textContent, lines(p)]), lines(el)]; }"""


def test_long_names_wrap_at_their_separators_and_numbers_sit_under_their_headers(
        cluster: Cluster, browser: Any) -> None:
    """A long queue name wraps after "_", "." or "-", never inside a word, in the queue list
    and the queue page's title, on a phone and a desktop; in the Browse, Groups and
    Consumers tables each number's header is right-aligned over it."""
    node = cluster.nodes[0]
    http = node.http()
    name = "tenant_eu-west.billing_invoices-reconciliation.nightly_batch-retries_dead"
    http.post("/API/v1/queues", {"name": name, "type": "fair"})
    for i in range(2):
        http.post(f"/API/v1/queues/{name}/messages",
                  {"content": f"m{i}", "priority": 1234567 + i, "group": "g"})
    for width, height in ((390, 844), (1280, 800)):
        page = browser.new_page(viewport={"width": width, "height": height})
        try:
            page.goto(f"http://{node.host}:{node.http_port}/")
            link = page.locator(f'tr[data-queue="{name}"] a')
            link.wait_for()
            assert link.inner_text() == name
            parts, lines = link.evaluate(_LINES_OF_PARTS)
            assert "".join(p for p, _ in parts) == name and len(parts) > 5
            assert all(n == 1 for _, n in parts), (width, parts)       # no word split
            if width == 390:
                assert lines > 1, "the name wraps on a phone"
            link.click()
            title = page.locator("#queue-name")
            title.wait_for()
            parts, lines = title.evaluate(_LINES_OF_PARTS)
            assert "".join(p for p, _ in parts) == name
            assert all(n == 1 for _, n in parts), (width, parts)
        finally:
            page.close()

    ui = Page(browser, node)
    page = ui.open(f"/queues/{name}")        # "_", "." and "-" need no escaping
    wait_until(lambda: page.locator("#browse tr[data-browsed]").count() == 2, 10)
    page.wait_for_selector('#groups tr[data-group="g"]')
    offsets = page.evaluate("""() => {
        const out = [];
        for (const table of document.querySelectorAll("#browse table, #groups table")) {
            const heads = [...table.querySelectorAll("thead th")];
            const row = table.querySelector("tbody tr");
            heads.forEach((th, i) => {
                const td = row.children[i];
                if (!td || !td.classList.contains("num")) return;
                const right = (el) => { const r = document.createRange();
                    r.selectNodeContents(el); return r.getBoundingClientRect().right; };
                out.push([th.textContent, getComputedStyle(th).textAlign,
                          Math.abs(right(th) - right(td))]);
            });
        }
        return out; }""")
    assert {o[0] for o in offsets} >= {"Priority", "Deliveries", "Ready", "Unacked"}, offsets
    assert all(align == "right" and gap < 2 for _, align, gap in offsets), offsets
    ui.close()
