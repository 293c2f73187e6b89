"""OpenTelemetry for tasks, when ``opentelemetry-api`` is installed (the ``otel`` extra);
without it every function here does nothing.

Sending a task (``task.send``) opens a ``<queue> publish`` span (kind PRODUCER) and puts its
context in the message's metadata as W3C trace context (``traceparent``, and
``tracestate`` when there is one), so any consumer can continue the trace. ``doq worker``
runs each task in a ``<task> process`` span (kind CONSUMER) whose parent is that context:
one trace from the sender through every run (and retry) of the task. A run that raises
records the exception and sets the span's status to ERROR. Spans are recorded only where
the program configures an SDK (a TracerProvider); the API alone keeps them silent.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:                     # the optional extra is not installed
    trace = None  # type: ignore[assignment]

#: The metadata keys the trace context travels in.
KEYS = ("traceparent", "tracestate")
SYSTEM = "doq"


def enabled() -> bool:
    return trace is not None


@contextlib.contextmanager
def publishing(queue: str, task: str, metadata: dict[str, str]) -> Iterator[None]:
    """A PRODUCER span around sending a call of ``task`` to ``queue``; its context goes into
    ``metadata``."""
    if trace is None:
        yield
        return
    tracer = trace.get_tracer("doq_lib.tasks")
    with tracer.start_as_current_span(f"{queue} publish", kind=SpanKind.PRODUCER, attributes={
            "messaging.system": SYSTEM, "messaging.operation.type": "send",
            "messaging.destination.name": queue, "doq.task": task}):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        metadata.update({k: v for k, v in carrier.items() if k in KEYS})
        yield


def inject(metadata: dict[str, str]) -> None:
    """Put the current trace context (a running task's span) into ``metadata``."""
    if trace is not None:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        metadata.update({k: v for k, v in carrier.items() if k in KEYS})


@contextlib.contextmanager
def processing(queue: str, task: str, message_id: int, deliveries: int,
               metadata: Mapping[str, str]) -> Iterator[Any]:
    """A CONSUMER span around one run of ``task``, a child of the sender's context found in
    ``metadata``. An exception leaving the block is recorded on it (and raised on)."""
    if trace is None:
        yield None
        return
    parent = propagate.extract({k: metadata[k] for k in KEYS if k in metadata})
    tracer = trace.get_tracer("doq_lib.worker")
    with tracer.start_as_current_span(
            f"{task} process", context=parent, kind=SpanKind.CONSUMER,
            record_exception=False, set_status_on_exception=False, attributes={
                "messaging.system": SYSTEM, "messaging.operation.type": "process",
                "messaging.destination.name": queue, "messaging.message.id": str(message_id),
                "messaging.message.delivery_count": deliveries, "doq.task": task}) as span:
        try:
            yield span
        except BaseException as exc:
            try:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            except Exception:  # noqa: BLE001 - an exception whose text cannot be read
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


def failed(span: Any, error: str) -> None:
    """Mark ``span`` (from :func:`processing`) failed without an exception (a timeout)."""
    if trace is not None and span is not None:
        span.set_status(Status(StatusCode.ERROR, error))
