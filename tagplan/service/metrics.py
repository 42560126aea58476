"""Prometheus metrics (``/metrics``): jobs by status, queue depth, plan latency, cache hits.

Job figures are read from the database at scrape time (it is the source of truth, and the
workers that change it are other processes); cache hits are counted by this API process.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import case, func, select

from tagplan.db.models import Job, JobStatus
from tagplan.db.session import session_scope

__all__ = ["LATENCY_BUCKETS_S", "ServiceMetrics"]

LATENCY_BUCKETS_S = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class _JobCollector(Collector):
    def __init__(self, url: str) -> None:
        self.url = url

    def collect(self) -> Iterator[Metric]:
        with session_scope(self.url) as session:
            rows = session.execute(select(Job.status, func.count()).group_by(Job.status))
            counts = {status: count for status, count in rows}
            done = Job.status == JobStatus.SUCCEEDED
            row = session.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(Job.latency_s), 0.0),
                    *(func.sum(case((Job.latency_s <= b, 1), else_=0)) for b in LATENCY_BUCKETS_S),
                ).where(done, Job.latency_s.is_not(None))
            ).one()
        jobs = GaugeMetricFamily("tagplan_jobs", "Jobs by status.", labels=["status"])
        for status in JobStatus:
            jobs.add_metric([status.value], counts.get(status.value, 0))
        yield jobs
        yield GaugeMetricFamily(
            "tagplan_queue_depth", "Jobs waiting for a worker.", value=counts.get("queued", 0)
        )
        total, latency_sum, *cumulative = row
        buckets = [
            (str(b), int(c or 0)) for b, c in zip(LATENCY_BUCKETS_S, cumulative, strict=True)
        ]
        buckets.append(("+Inf", int(total)))
        yield HistogramMetricFamily(
            "tagplan_plan_latency_seconds",
            "Submission to result of succeeded jobs.",
            buckets=buckets,
            sum_value=float(latency_sum),
        )


class ServiceMetrics:
    """The app's registry (one per app, so tests can build several)."""

    def __init__(self, url: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_JobCollector(url))
        self.cache_hits = Counter(
            "tagplan_cache_hits",
            "Requests answered from stored results.",
            ["kind"],
            registry=self.registry,
        )
