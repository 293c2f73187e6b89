"""`doq tui` driven by Textual's Pilot against real nodes: every screen, the actions by keys,
counts moving, a leader change seen live, errors shown (not crashes) when nodes stop.
SVG screenshots of each screen go to tests/artifacts/ (git-ignored)."""
from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path
from typing import Any, Callable, Coroutine

import pytest
from rich.console import Console
from textual.widgets import DataTable, Input, Static

from tests.harness import REPO, Cluster, add_key
from tui.app import (
    ClusterScreen,
    ConfirmScreen,
    DoqConsole,
    FormScreen,
    HelpScreen,
    QueueScreen,
    QueuesScreen,
)
from tui.controls import BrowseScreen, GroupsScreen, SchedulesScreen
from tui.widgets import HELP_COLUMNS, help_table

pytestmark = pytest.mark.timeout(240)
ARTIFACTS = Path(REPO) / "tests" / "artifacts"


async def until(pilot: Any, predicate: Callable[[], Any], timeout: float = 15.0,
                what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - widgets may not be mounted yet
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await pilot.pause(0.05)


def run(cluster: Cluster, scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a Pilot scenario, then stop the cluster whatever happened."""
    try:
        asyncio.run(scenario())
    finally:
        cluster.stop()


def shot(app: DoqConsole, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    app.save_screenshot(filename=f"tui-{name}.svg", path=str(ARTIFACTS))


def text(app: DoqConsole, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


def rows(app: DoqConsole, selector: str) -> list[list[str]]:
    table = app.screen.query_one(selector, DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def fill(pilot: Any, app: DoqConsole, values: dict[str, str]) -> None:
    """Fill the open form and press enter in its first field."""
    screen = await until(pilot, lambda: app.screen if isinstance(app.screen, FormScreen)
                         else None, what="a form")
    for name, value in values.items():
        widget = screen.query_one(f"#f-{name}")
        widget.value = value
    first = next(iter(values))
    screen.query_one(f"#f-{first}", Input).focus()
    await pilot.press("enter")


def test_queues_and_messages_by_keys(tmp_path: Path) -> None:
    c = Cluster(str(tmp_path), size=1).start()
    node = c.nodes[0]
    url = f"http://127.0.0.1:{node.http_port}"
    http = node.http()

    async def scenario() -> None:
        app = DoqConsole([url], refresh_every=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, QueuesScreen), what="queues")
            await until(pilot, lambda: "leader node-0" in str(
                app.screen.query_one("#status").render()), what="status bar")
            # help lists every key
            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
            shot(app, "help")
            await pilot.press("escape")

            # create: a bad ack timeout is refused with the server's message, then fixed
            await pilot.press("n")
            await fill(pilot, app, {"name": "jobs", "ack_timeout": "5"})
            await until(pilot, lambda: isinstance(app.screen, FormScreen) and ">= 60" in str(
                app.screen.query_one("#form-error", Static).render()), what="form error")
            await fill(pilot, app, {"ack_timeout": "120"})
            await until(pilot, lambda: ["jobs"] == [r[0] for r in rows(app, "#queues")],
                        what="queue listed")
            assert http.get("/API/v1/queues/jobs").json()["settings"]["ack_timeout"] == 120
            # creating it again changes nothing, and the console says so
            said: list[str] = []
            notify = app.notify
            app.notify = lambda message, **kw: (said.append(str(message)),  # type: ignore
                                                notify(message, **kw))[1]
            await pilot.press("n")
            await fill(pilot, app, {"name": "jobs", "ack_timeout": "300"})
            await until(pilot, lambda: "queue jobs exists already: nothing changed" in said,
                        what="existed said")
            app.notify = notify                                      # type: ignore[method-assign]
            assert http.get("/API/v1/queues/jobs").json()["settings"]["ack_timeout"] == 120
            http.post("/API/v1/queues", {"name": "other", "type": "fair"})
            await until(pilot, lambda: len(rows(app, "#queues")) == 2, what="two queues")
            # filter
            await pilot.press("slash")
            await pilot.press(*"oth", "enter")
            await until(pilot, lambda: [r[0] for r in rows(app, "#queues")] == ["other"],
                        what="filtered")
            await pilot.press("slash")
            app.screen.query_one("#filter", Input).value = ""
            await pilot.press("enter")
            await until(pilot, lambda: len(rows(app, "#queues")) == 2, what="filter cleared")
            shot(app, "queues")

            # open "jobs"
            table = app.screen.query_one("#queues", DataTable)
            table.move_cursor(row=table.get_row_index("jobs"))
            await pilot.press("enter")
            screen = await until(pilot, lambda: app.screen if isinstance(
                app.screen, QueueScreen) else None, what="queue screen")
            assert screen.queue == "jobs"
            # a sparkline draws nothing until it has two samples (one would be a full bar)
            from textual.widgets import Sparkline

            def drawn() -> list[tuple[int, bool]]:
                return [(len(screen.samples[s.id[2:]]), s.visible)
                        for s in screen.query(Sparkline)]
            assert all(visible == (n >= 2) for n, visible in drawn()), drawn()
            await until(pilot, lambda: all(v for _, v in drawn()), what="sparklines drawn")
            for i in range(3):
                await pilot.press("e")
                await fill(pilot, app, {"content": f"job-{i}", "priority": str(i + 1)})
                await until(pilot, lambda: not isinstance(app.screen, FormScreen), what="sent")
            await until(pilot, lambda: "ready 3" in text(app, "#settings"), what="ready 3")

            # peek: the next message shown, nothing taken
            await pilot.press("p")
            await until(pilot, lambda: "peeked: not taken" in text(app, "#message"),
                        what="peeked")
            peeked = app.screen.message.id
            await pilot.pause(0.6)
            assert "ready 3" in text(app, "#settings") and "unacked 0" in text(app, "#settings")
            # take (no ack): the message peeked at, now unacked; then ack
            await pilot.press("T")
            await until(pilot, lambda: "taken, unacked" in text(app, "#message"),
                        what="taken")
            assert app.screen.message.id == peeked
            await until(pilot, lambda: "unacked 1" in text(app, "#settings"), what="unacked 1")
            await pilot.press("a")
            await until(pilot, lambda: "total 2" in text(app, "#settings"), what="acked")
            # acking again: the delivery is over, so the console sends nothing and says why
            said = []
            app.notify = lambda message, **kw: (said.append(str(message)),  # type: ignore
                                                notify(message, **kw))[1]
            await pilot.press("a")
            await until(pilot, lambda: any("not taken by this console" in m for m in said),
                        what="nothing to ack")
            # a peeked message offers no ack either
            await pilot.press("p")
            await until(pilot, lambda: "peeked: not taken" in text(app, "#message")
                        and "nothing to ack" in text(app, "#message")
                        and "a ack" not in text(app, "#message"), what="peeked, no ack")
            said.clear()
            await pilot.press("a", "k", "j")
            await until(pilot, lambda: len([m for m in said if "not taken" in m]) == 3,
                        what="three refusals")
            app.notify = notify                                      # type: ignore[method-assign]
            assert "total 2" in text(app, "#settings") and "unacked 0" in text(app, "#settings")
            # the server's refusal is shown, nothing crashes, and the next success clears it
            await pilot.press("T")
            await until(pilot, lambda: "taken, unacked" in text(app, "#message")
                        and "unacked 1" in text(app, "#settings"), what="taken again")
            behind = app.screen.message
            assert http.post(f"/API/v1/queues/jobs/messages/{behind.id}/nack",
                             {"priority": behind.priority}).status == 200
            await pilot.press("a")
            await until(pilot, lambda: "ack:" in app.last_error and "ack:" in str(
                app.screen.query_one("#status").render()), what="ack error shown")
            # take, touch, nack: back to ready
            await pilot.press("T")
            await until(pilot, lambda: "unacked 1" in text(app, "#settings"), what="take 2")
            await until(pilot, lambda: app.last_error == "" and "ack:" not in str(
                app.screen.query_one("#status").render()), what="the old error cleared")
            # the queue's consumers: this console holds it
            await pilot.press("C")
            await until(pilot, lambda: [(r[0], r[1], r[5]) for r in rows(app, "#consumers")]
                        == [(app.backend.client.consumer, "1", "1")], what="consumers")
            shot(app, "consumers")
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, QueueScreen), what="back to queue")
            # the queue's schedules: a refused cron shown in the form, then added, paused,
            # deleted after confirming
            await pilot.press("S")
            await until(pilot, lambda: isinstance(app.screen, SchedulesScreen), what="schedules")
            await pilot.press("n")
            await fill(pilot, app, {"name": "nightly", "cron": "61 * * * *",
                                    "timezone": "Europe/Berlin", "content": "report"})
            await until(pilot, lambda: isinstance(app.screen, FormScreen) and "cron" in str(
                app.screen.query_one("#form-error", Static).render()), what="cron refused")
            await fill(pilot, app, {"cron": "30 2 * * *"})
            await until(pilot, lambda: [(r[0], r[1], r[6]) for r in rows(app, "#schedules")]
                        == [("nightly", "30 2 * * * (Europe/Berlin)", "active")],
                        what="schedule added")
            shot(app, "schedules")
            await pilot.press("p")
            await until(pilot, lambda: rows(app, "#schedules")[0][6] == "paused",
                        what="schedule paused")
            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
            await pilot.press("y")
            await until(pilot, lambda: rows(app, "#schedules") == [], what="schedule deleted")
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, QueueScreen), what="back to queue")
            await pilot.press("t")
            nacked = app.screen.message.id
            await pilot.press("k")                  # asks why, and when it may come again
            form = await until(pilot, lambda: app.screen if isinstance(app.screen, FormScreen)
                               else None, what="nack form")
            assert app.focused is form.query_one("#f-error", Input)
            await pilot.press(*"flaky")
            await fill(pilot, app, {"delay": "0"})
            await until(pilot, lambda: "ready 2" in text(app, "#settings")
                        and "unacked 0" in text(app, "#settings"), what="nacked")
            assert f"message {nacked} nacked: back in the queue" in text(app, "#message")
            assert http.get(f"/API/v1/queues/jobs/messages/{nacked}").json()[
                "last_error"] == "flaky"
            # dequeue with ack
            await pilot.press("D")
            await until(pilot, lambda: "taken and acked" in text(app, "#message")
                        and "total 1" in text(app, "#settings"), what="dequeued with ack")
            # get by id, change priority, delete
            left = http.get("/API/v1/queues/jobs/messages?ack=false").json()["id"]
            http.post(f"/API/v1/queues/jobs/messages/{left}/nack", {"priority": 0})
            await pilot.press("g")
            await fill(pilot, app, {"id": left})
            await until(pilot, lambda: f"message {left}" in text(app, "#message"),
                        what="looked up")
            await pilot.press("u")
            await fill(pilot, app, {"priority": "42"})
            await until(pilot, lambda: http.get(f"/API/v1/queues/jobs/messages/{left}")
                        .json().get("priority") == 42, what="priority 42")
            await pilot.press("x")
            await pilot.press("y")
            await until(pilot, lambda: "total 0" in text(app, "#settings"), what="deleted")
            shot(app, "queue")

            # back, delete the other queue with confirmation
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, QueuesScreen), what="back")
            table = app.screen.query_one("#queues", DataTable)
            table.move_cursor(row=table.get_row_index("other"))
            await pilot.press("d")
            await pilot.press("y")
            await until(pilot, lambda: [r[0] for r in rows(app, "#queues")] == ["jobs"],
                        what="queue deleted")
            assert http.get("/API/v1/queues/other").status == 400

            # the node stops: an error in the status bar, the console keeps running
            node.stop()
            await until(pilot, lambda: "queues:" in app.last_error, 20, what="error shown")
            assert app.is_running
            status = str(app.screen.query_one("#status").render())
            assert "queues:" in status
            shot(app, "node-down")
            await pilot.press("q")

    run(c, scenario)


def test_retries_and_dead_letters_by_keys(tmp_path: Path) -> None:
    """The message lifecycle in the console: its settings in the new-queue form and in the
    settings form (l), the DLQ mark, deliveries and the last error in the message panel, reject (j)
    and redrive (R)."""
    c = Cluster(str(tmp_path), size=1).start()
    node = c.nodes[0]
    url = f"http://127.0.0.1:{node.http_port}"
    http = node.http()
    http.post("/API/v1/queues", {"name": "poison", "type": "delayed"})

    def form_error(app: DoqConsole) -> str:
        return str(app.screen.query_one("#form-error", Static).render()) \
            if isinstance(app.screen, FormScreen) else ""

    async def scenario() -> None:
        app = DoqConsole([url], refresh_every=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: len(rows(app, "#queues")) == 1, what="queues")
            # the new-queue form carries the lifecycle settings: a bad number and an unknown
            # dead-letter queue are refused in place (nothing created), then it is created
            await pilot.press("n")
            await fill(pilot, app, {"name": "orders", "max_messages": "lots"})
            await until(pilot, lambda: "whole numbers" in form_error(app), what="number")
            await fill(pilot, app, {"max_messages": "100", "dead_letter_queue": "nowhere"})
            await until(pilot, lambda: "dead_letter_queue" in form_error(app), what="no DLQ")
            assert http.get("/API/v1/queues/orders").status == 400
            shot(app, "create-lifecycle")
            await fill(pilot, app, {"dead_letter_queue": "poison", "max_deliveries": "3",
                                    "overflow": "drop_oldest"})
            await until(pilot, lambda: len(rows(app, "#queues")) == 2, what="created")
            assert http.get("/API/v1/queues/orders").json()["settings"] == {
                "strategy": "STRATEGY_UNSPECIFIED", "ack_timeout": 1800,
                "max_deliveries": 3, "dead_letter_queue": "poison", "max_messages": 100,
                "overflow": "drop_oldest"}
            mid = http.post("/API/v1/queues/orders/messages",
                            {"content": "bad", "priority": 1}).json()["id"]
            table = app.screen.query_one("#queues", DataTable)
            table.move_cursor(row=table.get_row_index("orders"))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, QueueScreen), what="queue")
            await until(pilot, lambda: "ready 1" in text(app, "#settings"), what="shown")
            await until(pilot, lambda: "dead letter queue poison" in text(app, "#settings"),
                        what="settings line")
            # the settings form shows the values: a bad number refused in place, then a
            # change saved while the rest is kept
            await pilot.press("l")
            form = await until(pilot, lambda: app.screen if isinstance(
                app.screen, FormScreen) else None, what="settings form")
            assert form.query_one("#f-max_deliveries", Input).value == "3"
            await fill(pilot, app, {"dedup_window": "x"})
            await until(pilot, lambda: "whole numbers" in form_error(app), what="form error")
            await fill(pilot, app, {"dedup_window": "60"})
            await until(pilot, lambda: http.get("/API/v1/queues/orders").json()["settings"]
                        .get("dedup_window") == 60, what="saved")
            kept = http.get("/API/v1/queues/orders").json()["settings"]
            assert (kept["max_deliveries"], kept["dead_letter_queue"], kept["overflow"]) == (
                3, "poison", "drop_oldest")
            # a delivery that fails, the panel shows its count and error; then reject
            http.get("/API/v1/queues/orders/messages?ack=false")
            http.post(f"/API/v1/queues/orders/messages/{mid}/nack",
                      {"priority": 0, "error": "card declined"})
            await pilot.press("T")
            await until(pilot, lambda: "deliveries 2" in text(app, "#message")
                        and "last error: card declined" in text(app, "#message"),
                        what="deliveries shown")
            await pilot.press("j")
            await until(pilot, lambda: http.get(f"/API/v1/queues/poison/messages/{mid}")
                        .status == 200, what="rejected")
            shot(app, "dead-letters")
            # the list marks the DLQ; its screen redrives
            await pilot.press("escape")
            await until(pilot, lambda: any(r[0] == "poison" and "DLQ" in r[1]
                                           for r in rows(app, "#queues")), what="DLQ mark")
            table = app.screen.query_one("#queues", DataTable)
            table.move_cursor(row=table.get_row_index("poison"))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, QueueScreen), what="dlq screen")
            await pilot.press("R")
            await until(pilot, lambda: http.get(f"/API/v1/queues/orders/messages/{mid}")
                        .status == 200, what="redriven")
            assert http.get(f"/API/v1/queues/orders/messages/{mid}").json()["deliveries"] == 0
            await pilot.press("q")

    run(c, scenario)


def test_operator_controls_by_keys(tmp_path: Path) -> None:
    """Operator controls in the console: pause / resume (P), the groups screen (G, p), browse with
    paging and why (b, n, w), purge with a choice and a confirmation (U)."""
    c = Cluster(str(tmp_path), size=1).start()
    node = c.nodes[0]
    url = f"http://127.0.0.1:{node.http_port}"
    http = node.http()
    http.post("/API/v1/queues", {"name": "tenants", "type": "fair"})
    for n in range(25):
        http.post("/API/v1/queues/tenants/messages", {
            "content": f"job {n}", "priority": 1, "group": ("a", "a.b", "b")[n % 3]})

    async def scenario() -> None:
        app = DoqConsole([url], refresh_every=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: len(rows(app, "#queues")) == 1, what="queues")
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, QueueScreen), what="queue")
            await until(pilot, lambda: "ready 25" in text(app, "#settings"), what="shown")
            await pilot.press("P")
            await until(pilot, lambda: "PAUSED" in text(app, "#settings"), what="paused")
            assert http.get("/API/v1/queues/tenants").json()["paused"] is True
            await pilot.press("P")
            await until(pilot, lambda: "PAUSED" not in text(app, "#settings"), what="resumed")
            # the groups screen: pause a (a.b follows)
            await pilot.press("G")
            await until(pilot, lambda: isinstance(app.screen, GroupsScreen)
                        and len(rows(app, "#groups")) == 3, what="groups")
            table = app.screen.query_one("#groups", DataTable)
            table.move_cursor(row=table.get_row_index("a"))
            await pilot.press("p")
            await until(pilot, lambda: ["a.b", "8", "0", "paused by a"] in rows(app, "#groups"),
                        what="a.b paused by a")
            assert http.get("/API/v1/queues/tenants/groups").json()["groups"][0]["paused"]
            shot(app, "groups")
            await pilot.press("escape")
            # browse: two pages, then why a message of a waits
            await pilot.press("b")
            await until(pilot, lambda: isinstance(app.screen, BrowseScreen)
                        and len(rows(app, "#browse")) == 20, what="page 1")
            await pilot.press("n")
            await until(pilot, lambda: len(rows(app, "#browse")) == 5
                        and "page 2" in text(app, "#browse-info"), what="page 2")
            await pilot.press("r")
            await until(pilot, lambda: len(rows(app, "#browse")) == 20, what="first page")
            table = app.screen.query_one("#browse", DataTable)
            table.move_cursor(row=next(i for i, r in enumerate(rows(app, "#browse"))
                                       if r[2] == "a"))
            await pilot.press("w")
            await until(pilot, lambda: "group a is paused" in text(app, "#browse-info"),
                        what="why")
            shot(app, "browse")
            assert http.get("/API/v1/queues/tenants").json()["ready"] == 25
            await pilot.press("escape")
            # purge everything, unacked included, after the choice and the confirmation
            http.get("/API/v1/queues/tenants/messages?ack=false")
            await pilot.press("U")
            form = await until(pilot, lambda: app.screen if isinstance(
                app.screen, FormScreen) else None, what="purge form")
            form.query_one("#f-include_unacked").value = "yes"
            await pilot.click("#ok")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
            await pilot.press("y")
            await until(pilot, lambda: http.get("/API/v1/queues/tenants").json()["total"] == 0,
                        what="purged")
            await pilot.press("q")

    run(c, scenario)


def test_cluster_screen_sees_a_leader_change(tmp_path: Path) -> None:
    c = Cluster(str(tmp_path)).start()
    urls = [f"http://127.0.0.1:{n.http_port}" for n in c.nodes]

    async def scenario() -> None:
        app = DoqConsole(urls, refresh_every=0.5)
        async with app.run_test(size=(130, 30)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, QueuesScreen), what="queues")
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ClusterScreen), what="cluster")
            # each answers for itself (a member whose address is not listed yet shows as the
            # leader sees it, without term and indexes)
            await until(pilot, lambda: len(rows(app, "#nodes")) == 3
                        and all(r[2] == "[green]up[/]" for r in rows(app, "#nodes")),
                        what="3 nodes up")
            old = c.leader()
            leader_rows = [r for r in rows(app, "#nodes") if "leader" in r[1]]
            assert [r[0] for r in leader_rows] == [old.node_id]
            assert all(r[3] != "–" and r[4] != "–" for r in rows(app, "#nodes"))  # term, commit
            shot(app, "cluster")
            old.kill()
            await until(pilot, lambda: "leader changed" in text(app, "#events"), 30,
                        what="leader change seen")
            new = [r for r in rows(app, "#nodes") if "leader" in r[1]]
            assert new and new[0][0] != old.node_id, (text(app, "#events"), rows(app, "#nodes"))
            assert f"leader changed: {old.node_id} →" in text(app, "#events")
            down = [r for r in rows(app, "#nodes") if r[0] == old.node_id]
            assert down and "down" in down[0][2]
            shot(app, "cluster-leader-change")
            await pilot.press("q")

    run(c, scenario)


def test_with_keys_the_console_sends_its_key(tmp_path: Path) -> None:
    """`doq tui --api-key` / DOQ_API_KEY: without a key the status bar says why; with a
    reader key the queues show, the cluster screen shows the nodes alive, and a write the
    key may not make is refused in the status bar."""
    import doq
    from doq_lib.client import Security

    keys = tmp_path / "keys.yaml"
    admin, reader = add_key(keys, "ops", "admin"), add_key(keys, "viewer", "reader")
    c = Cluster(str(tmp_path), size=1, flags={"auth.keys_file": str(keys)})
    c.nodes[0].admin_key = admin
    c.start()
    node = c.nodes[0]
    url = f"http://127.0.0.1:{node.http_port}"
    node.http().post("/API/v1/queues", {"name": "seen", "type": "delayed"},
                     headers=node.admin_headers())
    args = doq.parse_args(["tui", f"--url={url}"])
    assert doq.client_security(args, {"DOQ_API_KEY": reader}).api_key == reader
    flag = doq.parse_args(["tui", f"--url={url}", "--api-key=other"])
    assert doq.client_security(flag, {"DOQ_API_KEY": reader}).api_key == "other"

    async def scenario() -> None:
        anonymous = DoqConsole([url], refresh_every=0.5)
        async with anonymous.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: "API key is required" in anonymous.last_error,
                        what="the refusal shown")
            await pilot.press("q")
        app = DoqConsole([url], refresh_every=0.5, security=Security(api_key=reader))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, QueuesScreen), what="queues")
            await until(pilot, lambda: ["seen"] == [r[0] for r in rows(app, "#queues")],
                        what="the queue listed")
            await pilot.press("n")
            await fill(pilot, app, {"name": "forbidden", "ack_timeout": "120"})
            await until(pilot, lambda: isinstance(app.screen, FormScreen) and "may not" in str(
                app.screen.query_one("#form-error", Static).render()), what="refused")
            await pilot.press("escape")
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ClusterScreen), what="cluster")
            # /internal/status is for admins: the node shows as up (from /livez), no term
            await until(pilot, lambda: [r[2] for r in rows(app, "#nodes")] == ["[green]up[/]"],
                        what="node up")
            await pilot.press("q")

    run(c, scenario)


def footer_keys(app: DoqConsole) -> list[tuple[str, int, int]]:
    """The keys the current screen's footer shows: (key, left column, right column)."""
    from textual.widgets import Footer
    from textual.widgets._footer import FooterKey

    footer = app.screen.query_one(Footer)
    return [(key.key_display, key.region.x, key.region.right)
            for key in footer.query(FooterKey)]


def test_keys_fit_at_120_columns_and_forms_take_what_is_typed(tmp_path: Path) -> None:
    """At 120 x 40: every footer shows all its keys inside the screen (the rest are under
    `?`), the help's table of every key fits without scrolling, and a form opens with its
    first field focused, so what is typed lands in it."""
    c = Cluster(str(tmp_path), size=1).start()
    node = c.nodes[0]
    http = node.http()
    http.post("/API/v1/queues", {"name": "fit", "type": "delayed"})
    http.post("/API/v1/queues/fit/messages", {"content": "one", "priority": 1})

    async def scenario() -> None:
        app = DoqConsole([f"http://127.0.0.1:{node.http_port}"], refresh_every=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, QueuesScreen)
                        and rows(app, "#queues"), what="queues")

            async def fits(where: str) -> None:
                def laid_out() -> bool:
                    keys = footer_keys(app)
                    return "?" in [key for key, _, _ in keys] and \
                        all(right > left for _, left, right in keys)
                await until(pilot, laid_out, what=f"{where}: the footer laid out")
                keys = footer_keys(app)
                assert all(0 <= left < right <= 120 for _, left, right in keys), (where, keys)
                assert "?" in [key for key, _, _ in keys], (where, keys)
            await fits("queues")
            await pilot.press("n")                          # a form: typing fills it
            form = await until(pilot, lambda: app.screen if isinstance(
                app.screen, FormScreen) else None, what="new queue form")
            assert app.focused is form.query_one("#f-name", Input)
            await pilot.press(*"typed")
            assert form.query_one("#f-name", Input).value == "typed"
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, QueuesScreen), what="closed")

            await pilot.press("question_mark")
            help_screen = await until(pilot, lambda: app.screen if isinstance(
                app.screen, HelpScreen) else None, what="help")
            await pilot.pause(0.3)
            columns = help_screen.query_one("#help-columns")
            assert columns.virtual_size.height <= columns.size.height, \
                (columns.virtual_size, columns.size)
            shown = []                      # each column as drawn at its width on screen
            for column, sections in zip(help_screen.query(".help-column"), HELP_COLUMNS):
                console = Console(width=column.size.width, file=io.StringIO(), record=True)
                console.print(help_table(sections))
                shown.append(" ".join(console.export_text().split()))   # wrapped lines joined
            for line in ("T take the next message (unacked)", "k nack it (why, when again)",
                         "R redrive dead letters back", "? these keys"):
                assert any(line in text for text in shown), (line, shown)
            shot(app, "help-fits")
            await pilot.press("escape")

            table = app.screen.query_one("#queues", DataTable)
            table.move_cursor(row=table.get_row_index("fit"))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, QueueScreen)
                        and "ready 1" in text(app, "#settings"), what="queue screen")
            await fits("queue")
            shot(app, "queue-footer")
            await pilot.press("e")
            form = await until(pilot, lambda: app.screen if isinstance(
                app.screen, FormScreen) else None, what="enqueue form")
            assert app.focused is form.query_one("#f-content", Input)
            await pilot.press(*"hello world", "enter")
            await until(pilot, lambda: "ready 2" in text(app, "#settings"), what="enqueued")
            contents = sorted(m["content"] for m in http.get(
                "/API/v1/queues/fit/messages?browse=true").json()["messages"])
            assert contents == ["hello world", "one"]
            for screen_key in ("b", "C", "S"):
                await pilot.press(screen_key)
                await until(pilot, lambda: not isinstance(app.screen, QueueScreen),
                            what=f"screen {screen_key}")
                await fits(screen_key)
                await pilot.press("escape")
                await until(pilot, lambda: isinstance(app.screen, QueueScreen), what="back")
            await pilot.press("q")

    run(c, scenario)


def test_a_redirected_stderr_does_not_blank_the_screen(tmp_path: Path) -> None:
    """`doq tui 2>log` on a terminal: the screen is drawn on the terminal (standard output)
    and the log gets none of it; `q` quits with 0. Without any terminal it says so (2)."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import subprocess
    import sys
    import termios

    from tests.harness import DOQ

    c = Cluster(str(tmp_path / "node"), size=1).start()
    url = f"--url=http://127.0.0.1:{c.nodes[0].http_port}"
    env = {**os.environ, "TERM": "xterm-256color"}
    try:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        log = tmp_path / "err.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen([sys.executable, DOQ, "tui", url], stdin=slave,
                                    stdout=slave, stderr=err, env=env, cwd=REPO,
                                    start_new_session=True)
        os.close(slave)
        seen = b""
        try:
            deadline = time.monotonic() + 60
            while b"Queues" not in seen and time.monotonic() < deadline:
                ready, _, _ = select.select([master], [], [], 0.5)
                if ready:
                    try:
                        seen += os.read(master, 65536)
                    except OSError:
                        break
            assert b"Queues" in seen, seen[-2000:]
            os.write(master, b"q")
            end = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < end:
                ready, _, _ = select.select([master], [], [], 0.2)
                if ready:
                    try:
                        os.read(master, 65536)
                    except OSError:
                        pass
            assert proc.wait(timeout=5) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(master)
        assert b"\x1b[" not in log.read_bytes(), log.read_bytes()[:500]
        done = subprocess.run([sys.executable, DOQ, "tui", url], capture_output=True,
                              stdin=subprocess.DEVNULL, env=env, cwd=REPO, timeout=60)
        assert done.returncode == 2 and b"needs a terminal" in done.stderr, done.stderr
    finally:
        c.stop()
