"""The examples of the README and of the manual (docs/) work verbatim against a running node
(only the port differs)."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness import DOQ, REPO, Cluster

#: Where the examples live: the README (the front page) and the manual's pages.
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in Path(REPO, "docs").glob("*.md"))]


def _sections(text: str) -> dict[str, str]:
    """The ``#`` and ``##`` sections of a Markdown text by title (a ``#`` section runs to
    the next ``#`` heading); lines inside code blocks are never headings."""
    found: dict[str, tuple[int, int]] = {}
    open_: list[tuple[str, int, int]] = []          # (title, level, first line)
    lines = text.splitlines(keepends=True)
    fenced = False
    for n, line in enumerate(lines + ["# (end)\n"]):
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"(#{1,2}) (.+)\n", line)
        if match:
            level = len(match.group(1))
            for title, _, start in [o for o in open_ if o[1] >= level]:
                found.setdefault(title, (start, n))
            open_ = [o for o in open_ if o[1] < level] + [(match.group(2).strip(), level, n)]
    return {title: "".join(lines[a:b]) for title, (a, b) in found.items()}


def _section(title: str) -> str:
    """The section ``title`` of the README or of a page of the manual: it must be in exactly
    one of them."""
    hits = []
    for page in PAGES:
        sections = _sections(Path(REPO, page).read_text(encoding="utf-8"))
        if title in sections:
            hits.append((page, sections[title]))
    assert len(hits) == 1, f"section {title!r} is in {[h[0] for h in hits] or 'no page'}"
    return hits[0][1]


def _block(title: str, language: str = "sh", index: int = 0) -> str:
    """The first (or the ``index``-th) ``language`` code block of the section ``title``
    (README or manual)."""
    blocks = re.findall(rf"```{language}\n(.*?)```", _section(title), re.S)
    assert len(blocks) > index, f"section {title!r} has no {language} block {index}"
    return str(blocks[index])


def _curl_commands(title: str) -> list[str]:
    """The commands of a README section's sh block (comments dropped, continuations joined)."""
    lines = [ln for ln in _block(title).splitlines() if not ln.startswith("#")]
    return [c.strip() for c in "\n".join(lines).replace("\\\n", " ").split("\n") if c.strip()]


def _run_curl(commands: list[str], tmp_path: object) -> list[str]:
    """Run ``commands`` verbatim against a fresh node (only the port differs); each must
    answer 200; their bodies in order."""
    assert shutil.which("curl"), "the README's examples need curl (.ci/run installs it)"
    assert commands and all(c.startswith("curl") for c in commands)
    c = Cluster(str(tmp_path), size=1).start()
    try:
        port = str(c.nodes[0].http_port)
        outputs = []
        for command in commands:
            argv = [a.replace("localhost:8000", f"127.0.0.1:{port}") for a in shlex.split(command)]
            done = subprocess.run(argv + ["-s", "-w", "\n%{http_code}"], capture_output=True,
                                  text=True, timeout=30, check=True)
            body, code = done.stdout.rsplit("\n", 1)
            assert code == "200", (command, body)
            outputs.append(body)
        return outputs
    finally:
        c.stop()


def test_readme_lists_the_two_setup_commands_first() -> None:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    first_block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)  # type: ignore[union-attr]
    assert first_block.lstrip().startswith("make run") and "make test" in first_block


def test_quick_start_commands_work_verbatim(tmp_path: object) -> None:
    commands = _curl_commands("Quick start")
    assert len(commands) == 3
    outputs = _run_curl(commands, tmp_path)
    assert '"status":"CREATED"' in outputs[0]
    assert '"status":"ENQUEUED"' in outputs[1]
    assert '"status":"DEQUEUED"' in outputs[2] and '\\"user_id\\": 1' in outputs[2]


def _json_values(text: str) -> list[Any]:
    """The JSON documents printed one after another (curl adds no newline)."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        while text[at].isspace():
            at += 1
        value, at = decoder.raw_decode(text, at)
        out.append(value)
    return out


def test_the_delivery_examples_run_verbatim_after_the_quick_start(tmp_path: Path) -> None:
    """Quick start, then the manual's delivery-token and batch examples, in that order on
    one node, each block as one shell script (only the port differs): the token names the
    delivery taken, the ack with it settles it, and the batch take and ack settle both."""
    assert shutil.which("curl") and shutil.which("python3")
    quick = _block("Quick start")
    token, batch = (_block("Delivery, acks and tokens", "sh", i) for i in (0, 1))
    commands = [ln for block in (token, batch) for ln in block.splitlines()
                if not ln.startswith("#")]
    assert not [ln for ln in commands if re.search(r"\d{15}", ln)], "no hard-coded ids"
    c = Cluster(str(tmp_path), size=1).start()
    try:
        port = str(c.nodes[0].http_port)

        def sh(script: str) -> str:
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c",
                                   script.replace("localhost:8000", f"127.0.0.1:{port}")],
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, (script, done.stdout, done.stderr)
            return done.stdout
        sh(quick)
        enqueued, taken, ack = _json_values(sh(token))        # the enqueue, the echo, the ack
        assert taken["status"] == "DEQUEUED" and taken["content"] == "token demo"
        assert taken["id"] == enqueued["id"] and taken["delivery"].startswith(taken["id"] + "-1-")
        assert ack["status"] == "ACKNOWLEDGED", ack
        stored, acked = _json_values(sh(batch))
        assert sorted(acked["acked"]) == sorted(stored["ids"]) and len(stored["ids"]) == 2
        assert acked["failed"] == [], acked
    finally:
        c.stop()


def test_the_readme_is_a_front_page() -> None:
    """At most 200 lines: what DOQ is and why, the two commands, a curl quick start, tasks
    in ten lines, the compose cluster, and links into the manual; the tasks example is the
    manual's own."""
    text = Path(REPO, "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    titles = [t for t in _sections(text) if not t.startswith("DOQ")]
    assert titles == ["Why DOQ, beside Celery on Redis or RabbitMQ", "Set up and run",
                      "Quick start", "Tasks in ten lines", "Docker and Kubernetes",
                      "Documentation"]
    for language in ("python", "sh"):
        assert _block("Tasks in ten lines", language) == _block("Run tasks", language)
    python = _block("Tasks in ten lines", "python")
    assert len([ln for ln in python.splitlines() if ln.strip()]) <= 10
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert links and all(Path(REPO, link).is_file() for link in links), links


def test_retries_and_dead_letters_work_verbatim(tmp_path: object) -> None:
    commands = _curl_commands("Retries and dead letters")
    assert len(commands) == 8
    outputs = [json.loads(body) for body in _run_curl(commands, tmp_path)]
    assert outputs[3]["deliveries"] == 1 and "last_error" not in outputs[3]
    assert (outputs[5]["deliveries"], outputs[5]["last_error"]) == (2, "storage timed out")
    assert outputs[6] == {"status": "REJECTED", "id": "42"}
    dead = outputs[7]
    assert dead["content"] == "resize image 7" and dead["deliveries"] == 0
    assert {k: v for k, v in dead["metadata"].items() if k != "x-dead-at"} == {
        "x-dead-reason": "rejected", "x-dead-from": "jobs", "x-deliveries": "2",
        "x-last-error": "not an image"}


def test_operator_controls_work_verbatim(tmp_path: object) -> None:
    commands = _curl_commands("Operator controls")
    assert len(commands) == 10
    outputs = [json.loads(body) for body in _run_curl(commands, tmp_path)]
    assert outputs[3] == {"status": "PAUSED", "group": "acme"}
    assert outputs[4] == {"id": "7", "state": "blocked", "ahead": 1,
                          "reasons": [{"code": "group_paused", "group": "acme"}]}
    assert outputs[5]["groups"][0] == {"group": "acme", "ready": 1, "unacked": 0,
                                       "paused": True}
    # globex's first (a dequeue would take it), then acme's, held back
    assert [(m["id"], m["state"]) for m in outputs[6]["messages"]] == [
        ("8", "ready"), ("7", "blocked")]
    assert outputs[6]["next"] is None
    assert (outputs[7], outputs[8]) == ({"status": "PAUSED"}, {"status": "RESUMED"})
    assert outputs[9] == {"status": "PURGED", "purged": 2}


def test_schedules_work_verbatim(tmp_path: object) -> None:
    commands = _curl_commands("Schedules")
    assert len(commands) == 6
    outputs = [json.loads(body) if body else None for body in _run_curl(commands, tmp_path)]
    nightly, heartbeat = outputs[1]["schedule"], outputs[2]["schedule"]
    assert (outputs[1]["status"], nightly["timezone"], nightly["catch_up"]) == (
        "CREATED", "Europe/Berlin", "one")
    assert nightly["message"] == {"content": '{"task": "daily-report"}'}
    assert (heartbeat["every"], heartbeat["message"]["priority"]) == (60, 1)
    assert [s["name"] for s in outputs[3]["schedules"]] == ["heartbeat", "nightly"]
    assert outputs[4] == {"status": "PAUSED", "name": "heartbeat", "changed": True}
    assert outputs[5] == {"status": "DELETED", "name": "nightly"}


def _client_example() -> str:
    return _block("gRPC and the Python client", "python")


def test_the_client_example_runs(tmp_path: object) -> None:
    """The README's Python example, against a node with gRPC (the second URL is down)."""
    from tests.harness import free_ports

    source = _client_example()
    c = Cluster(str(tmp_path), size=1, flags={"grpc.address": "127.0.0.1:0"}).start()
    try:
        port = c.nodes[0].http_port
        down = free_ports(1)[0]
        source = source.replace("localhost:8000", f"127.0.0.1:{port}")
        source = source.replace("localhost:8001", f"127.0.0.1:{down}")
        namespace: dict[str, object] = {}
        exec(compile(source, "README.md", "exec"), namespace)  # noqa: S102 - our own README
        client = namespace["client"]
        assert client.transport == "grpc"                       # type: ignore[attr-defined]
        info = client.queue("jobs")                             # type: ignore[attr-defined]
        # one message acked by the consumer, what it had prefetched given back on close,
        # 100 more from the producer, then 50 taken and acked in one batch each
        assert (info.total, info.unacked) == (149, 0), info
        assert [f.result().content for f in namespace["sent"]] == \
            [f"report {i}" for i in range(100)]                 # type: ignore[attr-defined]
        client.close()                                          # type: ignore[attr-defined]
    finally:
        c.stop()


def test_the_asyncio_client_example_runs(tmp_path: object) -> None:
    """The README's asyncio example, verbatim but for the port: it runs to its end, having
    taken and acked the 100 messages it sent, so the queue is empty after."""
    c = Cluster(str(tmp_path), size=1).start()
    try:
        port = c.nodes[0].http_port
        source = _block("gRPC and the Python client", "python", 1)
        source = source.replace("localhost:8000", f"127.0.0.1:{port}")
        done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                              cwd=REPO, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Unclosed" not in done.stderr, done.stderr[-3000:]    # aiohttp's leak warning
        from doq_lib.client import HttpClient
        with HttpClient([f"http://127.0.0.1:{port}"]) as client:
            info = client.queue("thumbnails")
            assert (info.total, info.unacked) == (0, 0), info
    finally:
        c.stop()


def test_backup_commands_work_verbatim(tmp_path: object) -> None:
    """The README's backup block (all but the offline reads, which need a stopped node)."""
    lines = [ln for ln in _block("Backups and restore").splitlines()
             if ln.strip() and not ln.startswith("#") and " get " not in ln]
    assert len(lines) == 3
    c = Cluster(str(tmp_path), size=1).start()
    try:
        port = str(c.nodes[0].http_port)
        script = "set -e\n" + "\n".join(lines) \
            .replace(".venv/bin/python doq.py", f"{sys.executable} {DOQ}") \
            .replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              timeout=120, cwd=str(tmp_path))
        assert done.returncode == 0, done.stderr
        assert '"backups": 2' in done.stdout
        assert os.path.getsize(os.path.join(str(tmp_path), "full.bak")) > 0
    finally:
        c.stop()


def test_the_security_sections_keys_commands_work(tmp_path: object) -> None:
    """The README's `doq keys` lines, then the curl line with the key they printed."""
    lines = [c.strip() for c in _block("Security").replace("\\\n", " ").splitlines()]
    lines = [c.split("#")[0].strip() for c in lines if c.strip()]
    keys_lines = [c for c in lines if c.startswith(".venv/bin/python doq.py keys")]
    assert len(keys_lines) == 4, keys_lines
    printed = []
    for line in keys_lines:
        argv = [sys.executable, DOQ] + shlex.split(line)[2:]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              cwd=str(tmp_path), check=True)
        printed.append(done.stdout)
    key = printed[0].strip()
    listed = [line.split()[:2] for line in printed[2].splitlines()]
    assert key.startswith("doq_") and listed[0] == ["NAME", "ROLE"]
    assert ["ops", "admin"] in listed and ["billing", "producer"] in listed, printed[2]
    keys_file = os.path.join(str(tmp_path), "keys.yaml")
    c = Cluster(str(tmp_path), size=1, flags={"auth.keys_file": keys_file}).start()
    try:
        curl = next(c for c in lines if c.startswith("curl"))
        argv = [a.replace("$KEY", key).replace("localhost:8000",
                                                  f"127.0.0.1:{c.nodes[0].http_port}")
                for a in shlex.split(curl)]
        done = subprocess.run(argv + ["-s", "-w", "\n%{http_code}"], capture_output=True,
                              text=True, timeout=30, check=True)
        assert done.stdout.rsplit("\n", 1)[1] == "200", done.stdout
        anonymous = [a for a in argv if a not in ("-H", f"Authorization: Bearer {key}")]
        done = subprocess.run(anonymous + ["-s", "-o", "/dev/null", "-w", "%{http_code}"],
                              capture_output=True, text=True, timeout=30, check=True)
        assert done.stdout == "401"
    finally:
        c.stop()


def test_the_run_tasks_example_runs_verbatim(tmp_path: Any) -> None:
    """The README's tasks.py and its two commands against a node (only the port and the
    paths differ): the worker runs the 100 calls, then stops cleanly on SIGINT."""
    import signal

    source = _block("Run tasks", "python")
    commands = [ln for ln in _block("Run tasks").splitlines() if ln.strip()]
    assert len(commands) == 2
    c = Cluster(str(tmp_path / "node"), size=1).start()
    try:
        url = f"127.0.0.1:{c.nodes[0].http_port}"
        work = tmp_path / "work"
        work.mkdir()
        (work / "tasks.py").write_text(source.replace("localhost:8000", url))
        env = {**os.environ, "PYTHONPATH": REPO}

        def argv(command: str) -> list[str]:
            out = shlex.split(command)
            out[0] = sys.executable
            return [os.path.join(REPO, "doq.py") if a == "doq.py" else a for a in out]
        subprocess.run(argv(commands[0]), cwd=work, env=env, check=True, timeout=60)
        worker = subprocess.Popen(argv(commands[1]), cwd=work, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            seen = ""                     # (threads' prints may share a line)
            assert worker.stdout is not None
            while len(re.findall(r"emailing user \d+", seen)) < 100:
                line = worker.stdout.readline()
                assert line, seen[-2000:]
                seen += line
            worker.send_signal(signal.SIGINT)
            rest, _ = worker.communicate(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
        assert worker.returncode == 0, rest
        users = sorted(int(n) for n in re.findall(r"emailing user (\d+)", seen))
        assert users == list(range(100))
    finally:
        c.stop()


def test_the_celery_example_runs_verbatim(tmp_path: Any) -> None:
    """The README's Celery app and its two commands against a node (only the port and the
    paths differ): a real Celery worker runs the 100 tasks, then stops cleanly."""
    import signal

    source = _block("Celery on DOQ", "python")
    commands = [ln for ln in _block("Celery on DOQ").splitlines() if ln.strip()]
    assert len(commands) == 2
    c = Cluster(str(tmp_path / "node"), size=1).start()
    try:
        url = f"127.0.0.1:{c.nodes[0].http_port}"
        work = tmp_path / "work"
        work.mkdir()
        (work / "celery_app.py").write_text(source.replace("localhost:8000", url))
        env = {**os.environ, "PYTHONPATH": f"{REPO}:{work}"}

        def argv(command: str) -> list[str]:
            out = shlex.split(command)
            if out[0] == ".venv/bin/celery":
                return [sys.executable, "-m", "celery"] + out[1:]
            return [sys.executable] + out[1:]
        subprocess.run(argv(commands[0]), cwd=work, env=env, check=True, timeout=60)
        worker = subprocess.Popen(argv(commands[1]), cwd=work, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            seen = ""
            assert worker.stdout is not None
            while len(re.findall(r"resizing image \d+", seen)) < 100:
                line = worker.stdout.readline()
                assert line, seen[-3000:]
                seen += line
            worker.send_signal(signal.SIGTERM)           # Celery's warm shutdown
            rest, _ = worker.communicate(timeout=60)
        finally:
            if worker.poll() is None:
                worker.kill()
        assert worker.returncode == 0, rest[-3000:]
        images = sorted(int(n) for n in re.findall(r"resizing image (\d+)", seen))
        assert images == list(range(100))
        from doq_lib.client import HttpClient
        with HttpClient([f"http://{url}"]) as client:
            info = client.queue("celery")
            assert (info.total, info.settings.ack_timeout) == (0, 300), info
    finally:
        c.stop()


def test_the_django_example_runs_verbatim(tmp_path: Any) -> None:
    """The README's Django set-up (startproject, startapp; the install is what make test
    did already), its settings, task module and two commands against a node (only the port
    and the paths differ): doq worker runs the 100 enqueued tasks."""
    import signal

    setup = [ln for ln in _block("Django tasks on DOQ", "sh", 0).splitlines() if ln.strip()]
    assert setup[0] == ".venv/bin/pip install '.[django]'" and len(setup) == 3
    settings_block = _block("Django tasks on DOQ", "python", 0)
    tasks_block = _block("Django tasks on DOQ", "python", 1)
    commands = [ln for ln in _block("Django tasks on DOQ", "sh", 1).splitlines() if ln.strip()]
    assert len(commands) == 2
    c = Cluster(str(tmp_path / "node"), size=1).start()
    try:
        url = f"127.0.0.1:{c.nodes[0].http_port}"
        work = tmp_path / "work"
        work.mkdir()

        def run(command: str) -> tuple[list[str], dict[str, str]]:
            words = shlex.split(command)
            env = {**os.environ, "PYTHONPATH": f"{REPO}:{work}"}
            while "=" in words[0]:
                name, _, value = words.pop(0).partition("=")
                env[name] = value
            if words[0] == ".venv/bin/django-admin":
                words[:1] = [sys.executable, "-m", "django"]
            else:
                words[0] = sys.executable
            return [os.path.join(REPO, "doq.py") if w == "doq.py" else w for w in words], env
        for command in setup[1:]:
            argv, env = run(command)
            subprocess.run(argv, cwd=work, env=env, check=True, timeout=60)
        if sys.version_info >= (3, 12):
            settings_block = settings_block.replace('"django_tasks", ', "")
            tasks_block = tasks_block.replace("from django_tasks import",
                                              "from django.tasks import")
        settings = work / "mysite" / "settings.py"
        settings.write_text(settings.read_text() + "\n" +
                            settings_block.replace("localhost:8000", url))
        (work / "shop" / "tasks.py").write_text(tasks_block)
        argv, env = run(commands[0])
        subprocess.run(argv, cwd=work, env=env, check=True, timeout=60)
        argv, env = run(commands[1])
        worker = subprocess.Popen(argv, cwd=work, env=env, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
        try:
            seen = ""
            assert worker.stdout is not None
            while len(re.findall(r"receipt for order \d+", seen)) < 100:
                line = worker.stdout.readline()
                assert line, seen[-3000:]
                seen += line
            worker.send_signal(signal.SIGTERM)
            rest, _ = worker.communicate(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
        assert worker.returncode == 0, rest[-3000:]
        orders = sorted(int(n) for n in re.findall(r"receipt for order (\d+)", seen))
        assert orders == list(range(100))
    finally:
        c.stop()
