"""The monitor's view of the engine, gathered when it is asked for (a scrape, a page).

Sources, none of which the monitor waits on for long:

* the actors' reports (``report.py``), at most ``metrics_report_interval_ms`` old;
* the shared offsets of the log and of the broker set (``engine/store/shared_offsets.py``), read
  as they are;
* the supervisor's status (actors, states, restarts, memory), one control request;
* the store's file system (``statvfs``).

A consumer group's lag is worked out here: the queue's max offset (its owner's report)
less the group's committed offset (the front's).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.config import StoreConfig
from engine.ipc.lifecycle import Lifecycle
from engine.ipc.messages import ControlReply, StatusQuery
from engine.metrics.families import COUNTER, FAMILIES, GAUGE, LATENCY_BOUNDS_S
from engine.metrics.report import Histogram, read_reports
from engine.security.acl import REFUSAL_CODES
from engine.store.disk_space import disk_space
from engine.store.shared_offsets import IN_SYNC_REPLICAS, LEASE_DEADLINE, SharedOffsets

log = logging.getLogger(__name__)
_STATUS_TIMEOUT_MS = 2_000
_STATES = tuple(Lifecycle)


@dataclass
class View:
    """Every sample, by family: rows of [label values..., value]; histograms by label values."""

    samples: dict[str, list[list[Any]]] = field(default_factory=dict)
    histograms: dict[str, list[tuple[list[str], Histogram]]] = field(default_factory=dict)
    supervisor: ControlReply | None = None

    def add(self, family: str, *row: Any) -> None:
        self.samples.setdefault(family, []).append(list(row))

    def rows(self, family: str) -> list[list[Any]]:
        return self.samples.get(family, [])


def supervisor_status(store_dir: Path) -> ControlReply | None:
    from engine.ipc.control import ControlTimeout, NotRunning, control

    try:
        reply = control(store_dir, StatusQuery(), timeout_ms=_STATUS_TIMEOUT_MS)
    except (ControlTimeout, NotRunning, OSError) as exc:
        log.warning("no status from the supervisor: %s", exc)
        return None
    return reply if reply.ok else None


def gather(store_dir: Path, run_dir: Path, config: StoreConfig, offsets: SharedOffsets) -> View:
    view = View()
    for report in read_reports(run_dir):
        for family, rows in report.samples.items():
            view.samples.setdefault(family, []).extend(rows)
        for family, histogram in report.histograms.items():
            labels: list[str] = [config.flush_mode] if family == "rmqpy_send_latency_seconds" else []
            view.histograms.setdefault(family, []).append((labels, histogram))
    _add_log(view, offsets.snapshot(0))
    _add_broker(view, config, offsets)
    _add_lag(view)
    space = disk_space(store_dir)  # the writer's DISK_FULL ratio is the same figure
    view.add("rmqpy_disk_used_ratio", space.used_ratio)
    view.add("rmqpy_disk_free_bytes", space.free_bytes)
    view.supervisor = supervisor_status(store_dir)
    if view.supervisor is not None:
        _add_actors(view, view.supervisor)
    return view


def _add_log(view: View, slots: dict[str, int]) -> None:
    confirmed = slots["confirmed_offset"]
    for name in ("written", "confirmed", "flushed", "dispatched", "index_applied", "min"):
        view.add("rmqpy_log_offset_bytes", name.removesuffix("_applied"), slots[f"{name}_offset"])
    view.add("rmqpy_log_behind_bytes", "flush", max(0, confirmed - slots["flushed_offset"]))
    view.add("rmqpy_log_behind_bytes", "dispatch", max(0, confirmed - slots["dispatched_offset"]))
    view.add("rmqpy_log_behind_bytes", "index", max(0, confirmed - slots["index_applied_offset"]))
    view.add("rmqpy_timers_pending_messages", slots["timers_pending"])
    view.add("rmqpy_transaction_halves_pending_messages", slots["halves_pending"])


def _add_broker(view: View, config: StoreConfig, offsets: SharedOffsets) -> None:
    """This engine's place in its broker set: master or not, as the writer decides (an elected engine
    takes writes while its lease, the membership actor's deadline in the slots, runs); and a master's
    in-sync replicas, with the floor below which a SYNC master refuses sends."""
    now_ms = time.monotonic_ns() // 1_000_000  # the writer's clock and test (CLOCK_MONOTONIC, one per host)
    master = now_ms <= offsets.get(LEASE_DEADLINE) if config.elected else not config.is_replica
    broker_set = (config.cluster_name, config.broker_name)
    view.add("rmqpy_broker_master", *broker_set, int(master))
    if master and config.replication_endpoint:
        view.add("rmqpy_replication_in_sync_replicas", *broker_set, offsets.get(IN_SYNC_REPLICAS))
        if config.sync_replication:
            view.add("rmqpy_replication_min_in_sync_replicas", *broker_set, config.min_in_sync_replicas)


def _add_lag(view: View) -> None:
    max_offsets = {(topic, queue_id): value for topic, queue_id, value in view.rows("rmqpy_queue_max_offset")}
    for group, topic, queue_id, committed in view.rows("rmqpy_group_committed_offset"):
        end = max_offsets.get((topic, queue_id))
        if end is not None and committed >= 0:
            view.add("rmqpy_group_lag_messages", group, topic, queue_id, max(0, end - committed))


def _add_actors(view: View, status: ControlReply) -> None:
    view.add("rmqpy_engine_degraded", int(status.state != "RUNNING"))
    for actor in status.actors:
        view.add("rmqpy_actor_condition", actor.name, int(bool(actor.condition)))
        view.add("rmqpy_actor_up", actor.name, int(actor.lifecycle == "RUNNING"))
        for state in _STATES:
            view.add("rmqpy_actor_state", actor.name, state, int(actor.lifecycle == state))
        view.add("rmqpy_actor_restarts", actor.name, actor.restarts)
        if "rss_bytes" in actor.detail:
            view.add("rmqpy_actor_resident_memory_bytes", actor.name, actor.detail["rss_bytes"])
            view.add("rmqpy_actor_open_files", actor.name, actor.detail["open_files"])
        for code in REFUSAL_CODES:
            if f"refused_{code.lower()}" in actor.detail:
                view.add("rmqpy_auth_refusals", actor.name, code, actor.detail[f"refused_{code.lower()}"])


class EngineCollector(Collector):
    """prometheus_client's view of ``gather``: one family per entry of ``FAMILIES``."""

    def __init__(self, store_dir: Path, run_dir: Path, config: StoreConfig) -> None:
        self.store_dir = store_dir
        self.run_dir = run_dir
        self.config = config
        self.offsets = SharedOffsets(run_dir)

    def collect(self) -> Iterator[Metric]:
        view = gather(self.store_dir, self.run_dir, self.config, self.offsets)
        for family in FAMILIES.values():
            names = list(family.labels)
            metric: CounterMetricFamily | GaugeMetricFamily
            if family.kind == COUNTER:
                metric = CounterMetricFamily(family.name, family.help, labels=names)
            elif family.kind == GAUGE:
                metric = GaugeMetricFamily(family.name, family.help, labels=names)
            else:
                histogram = HistogramMetricFamily(family.name, family.help, labels=names)
                for values, h in view.histograms.get(family.name, []):
                    histogram.add_metric(values, _buckets(h), h.sum_s)
                yield histogram
                continue
            # One sample per label set: a counter's reports add up (the front's requests and the writer's
            # sends taken straight), a gauge's last one stands.
            seen: dict[tuple[str, ...], float] = {}
            for row in view.rows(family.name):
                key = tuple(str(v) for v in row[:-1])
                seen[key] = seen.get(key, 0) + row[-1] if family.kind == COUNTER else row[-1]
            for label_values, value in seen.items():
                metric.add_metric(list(label_values), value)
            yield metric


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip([*map(str, LATENCY_BOUNDS_S), "+Inf"], histogram.counts, strict=True):
        running += count
        buckets.append((bound, running))
    return buckets
