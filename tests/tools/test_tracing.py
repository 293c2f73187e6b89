"""OpenTelemetry for tasks (the optional extra): the trace goes from the sender's span through
the message's ``traceparent`` metadata to a CONSUMER span per run in ``doq worker``, and on to
follow-ups; failures are recorded; without the package nothing changes."""
from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any, Iterator

import pytest
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from doq_lib.tasks import App, current  # noqa: E402
from doq_lib.worker import Worker  # noqa: E402
from tests.harness import REPO, NodeProc, running, wait_until  # noqa: E402


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with running(str(tmp_path_factory.mktemp("otel-node"))) as c:
        yield c.nodes[0]


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def test_a_trace_runs_from_the_sender_through_each_run_and_its_follow_ups(
        node: NodeProc, spans: InMemorySpanExporter) -> None:
    app = App(f"http://127.0.0.1:{node.http_port}")
    done: list[str] = []

    @app.task(queue="traced", name="child")
    def child(tag: str) -> None:
        done.append(tag)

    @app.task(queue="traced", name="parent")
    def parent(n: int) -> None:
        current().then(child, f"after {n}")

    @app.task(queue="traced", name="flaky", retries=1, backoff=(0, 0))
    def flaky() -> None:
        raise ValueError("boom")

    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as root:
        mid = parent.send(1)
        flaky.send()
    stored = app.client.get("traced", mid)
    context = root.get_span_context()
    assert stored.metadata["traceparent"].split("-")[1] == f"{context.trace_id:032x}"
    worker = Worker(app, ["traced"], concurrency=2, grace=5)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False},
                              daemon=True)
    thread.start()
    try:
        wait_until(lambda: done == ["after 1"] and worker.counts["dead_lettered"] == 1, 30)
    finally:
        worker.stop()
        thread.join(timeout=30)
    finished = spans.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for span in finished:
        by_name.setdefault(span.name, []).append(span)
    publish = {s.attributes["doq.task"]: s for s in by_name["traced publish"]}
    assert {s.kind for s in publish.values()} == {SpanKind.PRODUCER}
    assert all(s.parent.span_id == context.span_id for s in publish.values())
    (run,) = by_name["parent process"]
    assert run.kind == SpanKind.CONSUMER and run.parent.span_id == \
        publish["parent"].context.span_id
    assert run.context.trace_id == context.trace_id
    assert run.attributes["messaging.message.id"] == str(mid)
    (follow,) = by_name["child process"]
    assert follow.parent.span_id == run.context.span_id            # the chain's next step
    tries = by_name["flaky process"]
    assert len(tries) == 2                                         # the run and its retry
    assert [s.attributes["messaging.message.delivery_count"] for s in tries] == [1, 2]
    assert all(s.parent.span_id == publish["flaky"].context.span_id for s in tries)
    assert all(s.status.status_code == StatusCode.ERROR for s in tries)
    assert tries[0].events[0].name == "exception" and \
        tries[0].events[0].attributes["exception.type"] == "ValueError"
    app.close()


def test_without_opentelemetry_nothing_changes() -> None:
    """With the package absent, sending leaves the metadata alone and a run's span is a
    no-op."""
    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'opentelemetry':\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from doq_lib import tracing\n"
        "assert not tracing.enabled()\n"
        "meta = {'doq-task': 't'}\n"
        "with tracing.publishing('q', 't', meta):\n"
        "    pass\n"
        "with tracing.processing('q', 't', 1, 1, meta) as span:\n"
        "    assert span is None\n"
        "tracing.inject(meta)\n"
        "assert meta == {'doq-task': 't'}, meta\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
