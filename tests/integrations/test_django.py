"""Django's Tasks framework on DOQ, with the real Django and django-tasks packages: a
project's ``@task`` functions queued through ``DoqBackend`` and run by ``doq worker
doq_lib.integrations.django:app``: priorities, ``run_after``, two queues, a context's
attempt, an async task, retries then the dead-letter queue, and what the backend refuses."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from doq_lib.client import HttpClient  # noqa: E402
from tests.harness import REPO, running, wait_until  # noqa: E402

TASKS_IMPORT = ("from django.tasks import task" if sys.version_info >= (3, 12) else
                "from django_tasks import task")

SETTINGS = '''
SECRET_KEY = "test"
USE_TZ = True
INSTALLED_APPS = [{apps}"shop"]
TASKS = {{"default": {{
    "BACKEND": "doq_lib.integrations.django.DoqBackend",
    "QUEUES": ["default", "emails"],
    "OPTIONS": {{"URLS": [{url!r}], "RETRIES": 1, "BACKOFF": (0, 0)}},
}}}}
'''

SHOP_TASKS = '''
import os, time
{tasks_import}

MARKS = os.environ["SHOP_MARKS"]


def mark(text):
    with open(MARKS, "a") as f:
        f.write("%s %.3f\\n" % (text, time.time()))


@task()
def resize(n):
    mark("resize-%s" % n)


@task(priority=50)
def urgent(n):
    mark("urgent-%s" % n)


@task(queue_name="emails")
def email(user):
    mark("email-%s" % user)


@task()
def broken():
    mark("broken")
    raise ValueError("always")


@task(takes_context=True)
def attempt(context, n):
    mark("attempt-%s-%s-%s" % (n, context.attempt, context.task_result.id))


@task()
async def later(n):
    mark("async-%s" % n)
'''

SENDER = '''
import datetime as dt, json, sys
import django
django.setup()
from django.utils import timezone
from shop import tasks
out = {"refused": []}
for n in range(3):
    tasks.resize.enqueue(n)
out["urgent"] = tasks.urgent.enqueue(9).id
out["sent_at"] = timezone.now().timestamp()
out["deferred"] = tasks.resize.using(
    run_after=timezone.now() + dt.timedelta(seconds=3)).enqueue(100).id
tasks.email.enqueue("ada")
tasks.broken.enqueue()
result = tasks.attempt.enqueue(7)
out["attempt"] = [result.id, str(result.status), result.backend]
tasks.later.enqueue(1)
for bad in (lambda: tasks.resize.using(priority=101),
            lambda: tasks.resize.using(run_after=timezone.now() + dt.timedelta(days=31)).enqueue(1),
            lambda: tasks.resize.using(queue_name="nowhere").enqueue(1),
            lambda: tasks.resize.using(run_after=dt.datetime(2030, 1, 1)).enqueue(1)):
    try:
        bad()
    except Exception as exc:
        out["refused"].append(type(exc).__name__)
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with running(str(tmp_path_factory.mktemp("django-node"))) as c:
        yield c.nodes[0]


def test_django_tasks_run_on_doq_worker(node, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = f"http://127.0.0.1:{node.http_port}"
    apps = "" if sys.version_info >= (3, 12) else '"django_tasks", '
    (tmp_path / "settings.py").write_text(SETTINGS.format(apps=apps, url=url))
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "tasks.py").write_text(SHOP_TASKS.format(tasks_import=TASKS_IMPORT))
    marks = tmp_path / "marks"
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{tmp_path}", "DJANGO_SETTINGS_MODULE": "settings",
           "SHOP_MARKS": str(marks)}
    sent = subprocess.run([sys.executable, "-c", SENDER], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=60)
    assert sent.returncode == 0, sent.stderr[-3000:]
    out = json.loads(sent.stdout)
    assert out["refused"] == ["InvalidTaskError"] * 4, out
    assert out["attempt"][1:] == ["READY", "default"]
    worker = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "doq.py"), "worker",
         "doq_lib.integrations.django:app", "--queues", "default,emails", "--concurrency", "1"],
        cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        expected = {"resize-0", "resize-1", "resize-2", "urgent-9", "resize-100", "email-ada",
                    "async-1"}

        def seen() -> list[list[str]]:
            return [ln.split() for ln in marks.read_text().splitlines()] if marks.exists() \
                else []
        wait_until(lambda: expected <= {ln[0] for ln in seen()} and
                   sum(ln[0] == "broken" for ln in seen()) == 2 and
                   any(ln[0].startswith("attempt-") for ln in seen()), 60)
        with HttpClient([url]) as client:
            wait_until(lambda: client.queue("default.dead").total == 1, 15)
            dead = client.dequeue("default.dead", ack=True)
            assert dead.metadata["x-last-error"] == "ValueError: always"
            assert dead.metadata["doq-task"] == "shop.tasks.broken"
            wait_until(lambda: client.queue("default").total == 0, 15)
            assert client.queue("emails").total == 0
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, output[-3000:]
    lines = seen()
    default = [ln[0] for ln in lines if ln[0].startswith(("resize", "urgent"))]
    assert default[0] == "urgent-9", default              # priority 50 before 0
    deferred = next(float(ln[1]) for ln in lines if ln[0] == "resize-100")
    assert deferred >= out["sent_at"] + 2.9                   # run_after held by DOQ
    attempt = next(ln[0] for ln in lines if ln[0].startswith("attempt-"))
    assert attempt == f"attempt-7-1-{out['attempt'][0]}"      # first attempt, its result id
    assert "task shop.tasks.broken" in output and "dead-lettered" in output
