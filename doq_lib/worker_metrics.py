"""``doq worker``'s Prometheus metrics (``--metrics host:port``)."""
from __future__ import annotations


class WorkerMetrics:
    """The worker's Prometheus metrics, in a registry of their own (``serve`` exposes it):
    doq_worker_tasks_{started,succeeded,failed,retried,dead_lettered,abandoned}_total by
    task, doq_worker_task_duration_seconds by task, doq_worker_tasks_in_flight."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        words = {"started": "runs started", "succeeded": "runs that returned (acked)",
                 "failed": "runs that raised or timed out", "retried": "failed runs given "
                 "back for another try", "dead_lettered": "messages dead-lettered (retries "
                 "spent, not retryable, unknown task)", "abandoned": "runs past their task's "
                 "timeout, reported and abandoned"}
        self.counters = {outcome: Counter(f"doq_worker_tasks_{outcome}", text, ["task"],
                                          registry=self.registry)
                         for outcome, text in words.items()}
        self.duration = Histogram("doq_worker_task_duration_seconds", "a run's duration",
                                  ["task"], registry=self.registry)
        self.in_flight = Gauge("doq_worker_tasks_in_flight", "runs going on now",
                               registry=self.registry)

    def serve(self, address: str) -> None:
        """Expose the metrics over HTTP on ``host:port`` (a thread of its own)."""
        from prometheus_client import start_http_server

        host, _, port = address.rpartition(":")
        start_http_server(int(port), host or "127.0.0.1", registry=self.registry)
