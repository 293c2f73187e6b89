"""Prometheus metrics (L0). One registry per server instance (tests run several in a process).

Queue and Raft figures are not updated on the hot path: a collector reads them from the node's
state at scrape time (``QueueSample`` / ``RaftSample`` providers passed in by the server).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

GRPC_CODE_NAMES = {"OK": "OK", "CANCELLED": "Canceled"}     # else CamelCase, as Go prints them
HTTP_BUCKETS = (1e-9, 2e-9, 5e-9, 1e-8, 2e-8, 5e-8, 1e-7, 2e-7, 5e-7, 1e-6, 2e-6, 5e-6, 1e-5,
                2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2,
                0.5, 1, 2, 5, 10, 15, 20, 30)


def grpc_code_name(name: str) -> str:
    """A grpc.StatusCode name (NOT_FOUND) as Go's gRPC prints codes (NotFound)."""
    return GRPC_CODE_NAMES.get(name) or "".join(p.capitalize() for p in name.split("_"))


@dataclass(frozen=True)
class QueueSample:
    name: str
    ready: int
    unacked: int
    totals: dict[str, int]          # enqueue / dequeue / ack / nack counts applied here
    oldest_ms: int = 0               # time in the id of the oldest waiting message; 0: none
    redelivered: int = 0             # messages back to ready after their ack timeout
    dead_lettered: dict[str, int] | None = None     # reason -> messages dead-lettered
    rejected_full: int = 0           # enqueues refused: the queue held max_messages
    deduplicated: int = 0            # enqueues answered as duplicates (dedup window)
    purged: int = 0                  # messages dropped by purges
    paused: bool = False             # the queue delivers nothing until resumed
    paused_groups: int = 0           # fair queues: groups paused
    rate_limited: int = 0            # times a group ran out of its delivery rate
    dead_letter_refused: dict[str, int] | None = None   # reason -> refused by a full DLQ
    consumers: int = 0               # consumers the queue knows
    schedules: int = 0               # schedules the queue has
    occurrences: dict[str, int] | None = None   # its schedules' fired / skipped / refused


@dataclass(frozen=True)
class RaftSample:
    role: str                        # leader / follower / candidate
    term: int
    commit_index: int
    applied_index: int
    journal_syncs: int
    journal_sync_seconds: float
    entries_proposed: int
    ops_proposed: int
    follower_match: dict[str, int]   # raft address -> match index (leader only)


class _StateCollector:
    def __init__(self, queues: Callable[[], list[QueueSample]],
                 raft: Callable[[], RaftSample], clock: Callable[[], float],
                 gauges: Callable[[], list[tuple[str, str, float]]] | None = None) -> None:
        self._queues = queues
        self._raft = raft
        self._clock = clock
        self._gauges = gauges

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield from self._queue_families(self._queues(), self._clock())
        yield from self._raft_families(self._raft())
        for name, text, value in self._gauges() if self._gauges is not None else ():
            yield GaugeMetricFamily(name, text, value=value)

    @staticmethod
    def _queue_families(samples: list[QueueSample], now: float) -> Iterator[
            CounterMetricFamily | GaugeMetricFamily]:
        labels = ["queue_name"]
        counters = {kind: CounterMetricFamily(f"doq_queues_{kind}", f"{kind} operations applied",
                                              labels=labels)
                    for kind in ("enqueue", "dequeue", "ack", "nack")}
        gauges = {
            "messages": GaugeMetricFamily("doq_queues_messages", "ready + unacked", labels=labels),
            "unacked": GaugeMetricFamily("doq_queues_unacked_messages", "unacked",
                                         labels=labels),
            "ready": GaugeMetricFamily("doq_queues_ready_messages", "ready", labels=labels),
        }
        redelivered = CounterMetricFamily(
            "doq_queues_redelivered", "messages delivered again after their ack timeout ran out",
            labels=labels)
        dead = CounterMetricFamily(
            "doq_queues_dead_lettered", "messages moved to the dead-letter queue (or dropped, "
            "when the queue has none), by reason: max_deliveries, expired, overflow, rejected",
            labels=["queue_name", "reason"])
        refused = CounterMetricFamily(
            "doq_queues_dead_letters_refused", "dead letters the dead-letter queue refused "
            "(full, overflow reject): the message stayed where it was, by reason",
            labels=["queue_name", "reason"])
        full = CounterMetricFamily(
            "doq_queues_rejected_full", "enqueues refused because the queue held its "
            "max_messages (overflow reject)", labels=labels)
        dedup = CounterMetricFamily(
            "doq_queues_deduplicated", "enqueues answered as duplicates: their dedup key (or "
            "client id) was seen within the queue's dedup_window; nothing stored",
            labels=labels)
        purged = CounterMetricFamily(
            "doq_queues_purged", "messages dropped by purges", labels=labels)
        paused = GaugeMetricFamily(
            "doq_queues_paused", "1 while the queue is paused (delivers nothing)", labels=labels)
        groups_paused = GaugeMetricFamily(
            "doq_queues_group_paused", "groups of the queue that are paused (with their "
            "sub-groups)", labels=labels)
        limited = CounterMetricFamily(
            "doq_queues_rate_limited", "times a group ran out of its delivery rate "
            "(group_rate) and was skipped until its next delivery was allowed", labels=labels)
        known = GaugeMetricFamily(
            "doq_queue_consumers", "consumers the queue knows (named on dequeue; one holding "
            "nothing is forgotten after an hour unseen)", labels=labels)
        scheduled = GaugeMetricFamily(
            "doq_queue_schedules", "schedules the queue has", labels=labels)
        occurrences = CounterMetricFamily(
            "doq_queue_schedule_occurrences", "occurrences of the queue's schedules by "
            "outcome: fired (a message stored), skipped (missed, not caught up), refused (the "
            "queue was full); the same on every node (replicated state)",
            labels=["queue_name", "outcome"])
        oldest = GaugeMetricFamily(
            "doq_queues_oldest_message_age_seconds",
            "age of the oldest message not delivered yet (ready or scheduled), from the time "
            "in its id; 0 when there is none", labels=labels)
        for s in samples:
            for kind, family in counters.items():
                family.add_metric([s.name], s.totals.get(kind, 0))
            gauges["messages"].add_metric([s.name], s.ready + s.unacked)
            gauges["unacked"].add_metric([s.name], s.unacked)
            gauges["ready"].add_metric([s.name], s.ready)
            redelivered.add_metric([s.name], s.redelivered)
            for reason, count in sorted((s.dead_lettered or {}).items()):
                dead.add_metric([s.name, reason], count)
            for reason, count in sorted((s.dead_letter_refused or {}).items()):
                refused.add_metric([s.name, reason], count)
            full.add_metric([s.name], s.rejected_full)
            dedup.add_metric([s.name], s.deduplicated)
            purged.add_metric([s.name], s.purged)
            paused.add_metric([s.name], 1 if s.paused else 0)
            groups_paused.add_metric([s.name], s.paused_groups)
            limited.add_metric([s.name], s.rate_limited)
            known.add_metric([s.name], s.consumers)
            scheduled.add_metric([s.name], s.schedules)
            for outcome, count in sorted((s.occurrences or {}).items()):
                occurrences.add_metric([s.name, outcome], count)
            oldest.add_metric([s.name], max(now - s.oldest_ms / 1000, 0.0) if s.oldest_ms
                              else 0.0)
        yield from counters.values()
        yield from gauges.values()
        yield redelivered
        yield dead
        yield refused
        yield full
        yield dedup
        yield purged
        yield paused
        yield groups_paused
        yield limited
        yield known
        yield scheduled
        yield occurrences
        yield oldest

    @staticmethod
    def _raft_families(s: RaftSample) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        role = GaugeMetricFamily("doq_raft_role", "1 for the role this node has", labels=["role"])
        for name in ("leader", "follower", "candidate"):
            role.add_metric([name], 1 if s.role == name else 0)
        yield role
        yield GaugeMetricFamily("doq_raft_term", "current Raft term", value=s.term)
        yield GaugeMetricFamily("doq_raft_commit_index", "Raft commit index", value=s.commit_index)
        yield GaugeMetricFamily("doq_raft_applied_index", "index applied to the store",
                                value=s.applied_index)
        yield CounterMetricFamily("doq_raft_journal_fsyncs", "journal fsync calls",
                                  value=s.journal_syncs)
        yield CounterMetricFamily("doq_raft_journal_fsync_seconds", "time spent in journal fsync",
                                  value=s.journal_sync_seconds)
        yield CounterMetricFamily("doq_raft_entries_proposed", "Raft entries proposed here",
                                  value=s.entries_proposed)
        yield CounterMetricFamily("doq_raft_ops_proposed", "operations proposed here",
                                  value=s.ops_proposed)
        lag = GaugeMetricFamily("doq_raft_follower_lag_entries",
                                "leader's commit index minus the follower's match index",
                                labels=["follower"])
        for follower, match in sorted(s.follower_match.items()):
            lag.add_metric([follower], max(s.commit_index - match, 0))
        yield lag


class Metrics:
    def __init__(self, queues: Callable[[], list[QueueSample]],
                 raft: Callable[[], RaftSample],
                 clock: Callable[[], float] = time.time,
                 gauges: Callable[[], list[tuple[str, str, float]]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.registry.register(_StateCollector(queues, raft, clock, gauges))
        self.grpc_requests = Counter(
            "doq_grpc_requests", "finished gRPC calls (a stream counts once, when it ends)",
            ["method", "code"], registry=self.registry)
        self.grpc_duration = Histogram(
            "doq_grpc_request_duration_seconds", "gRPC call duration (streams: open to end)",
            ["method"], buckets=HTTP_BUCKETS + (60,), registry=self.registry)
        const = {"service": "doq"}
        self.http_requests = Counter(
            "doq_http_requests", "HTTP requests", ["status_code", "method", "path", "service"],
            registry=self.registry)
        self.http_duration = Histogram(
            "doq_http_request_duration_seconds", "HTTP request duration",
            ["status_code", "method", "path", "service"], buckets=HTTP_BUCKETS,
            registry=self.registry)
        self.http_in_progress = Gauge(
            "doq_http_requests_in_progress_total", "HTTP requests being served",
            ["method", "service"], registry=self.registry)
        self._service = const["service"]
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._in_progress: dict[str, Gauge] = {}

    def observe_http(self, method: str, path: str, status: int, seconds: float) -> None:
        key = (method, path, status)
        child = self._children.get(key)
        if child is None:
            labels = (str(status), method, path, self._service)
            child = (self.http_requests.labels(*labels), self.http_duration.labels(*labels))
            if len(self._children) < 4096:              # methods are chosen by clients
                self._children[key] = child
        child[0].inc()
        child[1].observe(seconds)

    def observe_grpc(self, method: str, code: str, seconds: float) -> None:
        self.grpc_requests.labels(method, grpc_code_name(code)).inc()
        self.grpc_duration.labels(method).observe(seconds)

    def in_progress(self, method: str) -> Gauge:
        gauge = self._in_progress.get(method)
        if gauge is None:
            gauge = self.http_in_progress.labels(method, self._service)
            if len(self._in_progress) < 64:          # methods are chosen by clients
                self._in_progress[method] = gauge
        return gauge
