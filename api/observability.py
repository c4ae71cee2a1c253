"""Prometheus metrics. Job and queue numbers are read from SQL and Redis at scrape time, so every
API process reports the same truth no matter which process (API or worker) did the work."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis import Redis
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from jobs.reads import job_stats, usage
from jobs.store.models import utcnow

log = logging.getLogger(__name__)

DISPATCH_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600)


class JobsCollector(Collector):
    def __init__(self, engine: Engine, redis: Redis):
        self.engine, self.redis = engine, redis
        # Dispatches happen in workers; the API observes them from job_transitions, incrementally, at each
        # scrape. Not registered on its own: it is yielded below, after this scrape's observations.
        self.dispatch = Histogram(
            "torchyard_dispatch_latency_seconds", "Time from queued to running, per attempt started.",
            buckets=DISPATCH_BUCKETS, registry=None,
        )
        self._dispatch_after = 0
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        try:
            with Session(self.engine) as session:
                counts = job_stats.status_counts(session)
                depths = job_stats.queue_depths(session)
                ingested = job_stats.events_ingested_total(session)
                held = usage.totals_by_owner(session, utcnow())
                with self._lock:
                    latencies, self._dispatch_after = job_stats.dispatches_after(session, self._dispatch_after)
                    for seconds in latencies:
                        self.dispatch.observe(seconds)
        except SQLAlchemyError as exc:
            log.warning("metrics: SQL does not answer (%s)", exc.__class__.__name__)
        else:
            jobs = GaugeMetricFamily("torchyard_jobs", "Jobs by status.", labels=["status"])
            for status, n in counts.items():
                jobs.add_metric([status], n)
            yield jobs
            yield CounterMetricFamily("torchyard_events_ingested", "Events stored from jobs' events.jsonl (rate() = ingest rate).",
                                      value=ingested)
            depth = GaugeMetricFamily("torchyard_queue_depth", "Queued jobs in each queue.", labels=["queue"])
            for name, n in sorted(depths.items()):
                depth.add_metric([name], n)
            yield depth
            gpu = CounterMetricFamily("torchyard_gpu_seconds", "GPU-seconds held by each owner's attempts (placement x time; "
                                      "running ones until now).", labels=["owner"])
            cpu = CounterMetricFamily("torchyard_cpu_slot_seconds", "CPU-slot-seconds held by each owner's attempts.", labels=["owner"])
            for owner, (gpu_s, cpu_s) in sorted(held.items()):
                gpu.add_metric([owner], gpu_s)
                cpu.add_metric([owner], cpu_s)
            yield gpu
            yield cpu
        yield from self.dispatch.collect()


def make_registry(engine: Engine, redis: Redis) -> tuple[CollectorRegistry, Histogram]:
    """A registry per app (not the global one), so several apps in one process do not collide."""
    registry = CollectorRegistry()
    latency = Histogram(
        "torchyard_http_request_duration_seconds", "HTTP request latency (streams: their whole duration).",
        ["method", "route", "status"], registry=registry,
    )
    registry.register(JobsCollector(engine, redis))
    return registry, latency
