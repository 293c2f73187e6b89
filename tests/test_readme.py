"""The README's quick start works verbatim against a running node (only the port differs)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

from tests.harness import DOQ, REPO, Cluster


def _quick_start_commands() -> list[str]:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README quick start has no sh block"
    lines = [ln for ln in block.group(1).splitlines() if not ln.startswith("#")]
    return [c.strip() for c in "\n".join(lines).replace("\\\n", " ").split("\n") if c.strip()]


def test_readme_lists_the_two_setup_commands_first() -> None:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    first_block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)  # type: ignore[union-attr]
    assert first_block.lstrip().startswith("make run") and "make test" in first_block


def test_quick_start_commands_work_verbatim(tmp_path: object) -> None:
    assert shutil.which("curl"), "the README's quick start needs curl (.ci/run installs it)"
    commands = _quick_start_commands()
    assert len(commands) == 3 and all(c.startswith("curl") for c in commands)
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
        assert '"status":"CREATED"' in outputs[0]
        assert '"status":"ENQUEUED"' in outputs[1]
        assert '"status":"DEQUEUED"' in outputs[2] and '\\"user_id\\": 1' in outputs[2]
    finally:
        c.stop()


def _client_example() -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("## gRPC and the Python client", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "README client section has no python block"
    return block.group(1)


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
        # one message acked; what the consumer had prefetched was given back on close
        assert (info.total, info.unacked) == (99, 0), info
        client.close()                                          # type: ignore[attr-defined]
    finally:
        c.stop()


def test_backup_commands_work_verbatim(tmp_path: object) -> None:
    """The README's backup block (all but the offline reads, which need a stopped node)."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Backups and restore", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README backup section has no sh block"
    lines = [ln for ln in block.group(1).splitlines()
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
