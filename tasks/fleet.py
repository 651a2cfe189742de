"""The fleet's gauges: queue depth, oldest queued age, completions, running jobs and
workers, per pipeline (and lane), read from the database and served by the maintenance
process (``omnijobs maintenance --metrics-port``), one per deployment.

Autoscalers (KEDA, deploy/kubernetes/) and dashboards scale on these, so they come
from the source of truth, the same numbers whichever process would have served them. A
scrape costs one read of ``QueueRepository.signals`` and of the worker registry, at most
once per ``OMNIJOBS_FLEET_METRICS_CACHE_S`` however many scrapers ask. A failed read
exports ``omnijobs_queue_signals_ok 0`` and no gauge, so nothing scales on a zero that
was never measured.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from storage.records import QueueSignals, SlotCount

from .runtime import WorkerRuntime

log = logging.getLogger(__name__)


class FleetCollector(Collector):
    def __init__(self, rt: WorkerRuntime) -> None:
        self.rt = rt
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._last: tuple[QueueSignals, dict[str, SlotCount]] | None = None

    def describe(self) -> list:
        """Nothing to declare up front: registering must not read the database."""
        return []

    def read(self) -> tuple[QueueSignals, dict[str, SlotCount]]:
        """The signals, and the serving workers and their slots per pipeline, at most
        one database read per cache period."""
        settings = self.rt.settings
        with self._lock:
            if self._last is None or time.monotonic() - self._read_at >= \
                    settings.fleet_metrics_cache_s:
                signals = self.rt.queues.signals(settings.pipelines,
                                                 settings.fleet_rate_window_s)
                self._last = (signals, self.rt.workers.slots(list(signals.running)))
                self._read_at = time.monotonic()
            return self._last

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ok = GaugeMetricFamily("omnijobs_queue_signals_ok",
                               "1 if the queue gauges were read from the database")
        try:
            signals, slots = self.read()
        except Exception:  # the database is down: say so, export no made-up zeros
            log.warning("queue signals unavailable", exc_info=True)
            ok.add_metric([], 0)
            yield ok
            return
        ok.add_metric([], 1)
        yield ok
        yield from families(signals, slots)


def families(signals: QueueSignals, slots: dict[str, SlotCount]) -> Iterator[GaugeMetricFamily]:
    by_lane = ["pipeline", "lane"]
    depth = GaugeMetricFamily("omnijobs_queue_depth", "Jobs queued, by pipeline and lane "
                              "(interactive: jobs of no batch; bulk: a batch's)", labels=by_lane)
    age = GaugeMetricFamily("omnijobs_queue_oldest_age_seconds", "Seconds since the oldest "
                            "queued job was submitted (0 when none waits)", labels=by_lane)
    rate = GaugeMetricFamily("omnijobs_queue_completion_rate", "Jobs completed per second "
                             "over the last OMNIJOBS_FLEET_RATE_WINDOW_S", labels=by_lane)
    for lane in signals.lanes:
        labels = [lane.pipeline, lane.lane]
        depth.add_metric(labels, lane.queued)
        oldest = lane.oldest_queued_at
        age.add_metric(labels, max(0.0, (signals.at - oldest).total_seconds()) if oldest else 0)
        rate.add_metric(labels, lane.completed / signals.window_s)
    running = GaugeMetricFamily("omnijobs_jobs_running", "Jobs running on an engine slot, by "
                                "pipeline (those only finalizing left out)", labels=["pipeline"])
    finalizing = GaugeMetricFamily("omnijobs_jobs_finalizing", "Jobs done on the engine that "
                                   "wait only for their mux and upload", labels=["pipeline"])
    serving = GaugeMetricFamily("omnijobs_workers", "Live workers taking the pipeline's jobs "
                                "(draining ones left out)", labels=["pipeline"])
    total = GaugeMetricFamily("omnijobs_worker_slots", "Engine slots of the workers counted "
                              "by omnijobs_workers", labels=["pipeline"])
    busy = GaugeMetricFamily("omnijobs_slots_busy", "Of omnijobs_worker_slots, those held by "
                             "a job generating (a guided job holds two)", labels=["pipeline"])
    for pipeline, n in signals.running.items():
        done = slots.get(pipeline, SlotCount()).finalizing
        # The database says running until the upload is recorded; the registry knows
        # which of those left the engine (a row is at most a heartbeat behind).
        running.add_metric([pipeline], max(0, n - done))
        finalizing.add_metric([pipeline], min(n, done))
    for pipeline, count in slots.items():
        serving.add_metric([pipeline], count.workers)
        total.add_metric([pipeline], count.slots)
        busy.add_metric([pipeline], count.busy)
    yield from (depth, age, rate, running, finalizing, serving, total, busy)


def serve_metrics(rt: WorkerRuntime, port: int) -> None:
    """The maintenance process's metrics port: its own metrics and the fleet's gauges."""
    from prometheus_client import start_http_server

    REGISTRY.register(FleetCollector(rt))
    start_http_server(port)
