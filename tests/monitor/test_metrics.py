"""Prometheus' endpoint on a live engine: the figures match what the test did."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from engine.config import ConfigError, StoreConfig
from engine.store.disk_space import disk_used_ratio
from tests.helpers import wait_dispatched
from tests.monitor.conftest import Monitored, monitored_engine, total, value

pytestmark = pytest.mark.timeout(90)

TOPIC = "metered"
QUEUES = 4


def test_a_scrape_under_load_counts_what_was_sent_pulled_and_committed(monitored: Monitored) -> None:
    sent = 0
    with monitored.engine.client() as client:
        client.create_topic(TOPIC, queue_count=QUEUES)
        stop = threading.Event()
        errors: list[BaseException] = []

        def produce() -> None:
            nonlocal sent
            try:
                with monitored.engine.client() as producer:
                    while not stop.is_set():
                        producer.send(TOPIC, [{"body": b"x" * 100} for _ in range(20)])
                        sent += 20
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)

        thread = threading.Thread(target=produce)
        thread.start()
        try:
            # scrapes while the producer runs: each one is whole, and the counters only grow
            seen = [total(monitored.wait_scrape(lambda s, n=n: total(s, "rmqpy_queue_sent_messages_total") > n),
                          "rmqpy_queue_sent_messages_total") for n in (0, 200, 400)]
            assert seen == sorted(seen)
        finally:
            stop.set()
            thread.join(30)
        assert not errors, errors
        wait_dispatched(client)  # the queues' units are written after the sends are answered
        pulled = len(client.pull(TOPIC, 0, 0, max_messages=50)["messages"])
        client.commit_offset("billing", TOPIC, 0, 7)
        max_offset_0 = client.queue_stats(TOPIC, 0)["max_offset"]

    def settled(s: dict) -> bool:
        return total(s, "rmqpy_queue_sent_messages_total", topic=TOPIC) == sent and \
            value(s, "rmqpy_queue_pulled_messages_total", topic=TOPIC, queue_id="0") == pulled and \
            value(s, "rmqpy_group_committed_offset", group="billing", topic=TOPIC, queue_id="0") == 7 and \
            total(s, "rmqpy_queue_max_offset", topic=TOPIC) == sent  # the owners report on their own beat

    samples = monitored.wait_scrape(settled)
    assert total(samples, "rmqpy_queue_max_offset", topic=TOPIC) == sent
    assert value(samples, "rmqpy_queue_max_offset", topic=TOPIC, queue_id="0") == max_offset_0
    assert value(samples, "rmqpy_group_lag_messages", group="billing", topic=TOPIC, queue_id="0") == max_offset_0 - 7
    assert total(samples, "rmqpy_queue_sent_bytes_total", topic=TOPIC) > 100 * sent  # records: body and header
    # every send was timed, under the flush mode of the engine
    assert value(samples, "rmqpy_send_latency_seconds_count", flush_mode="ASYNC_FLUSH") == sent // 20
    assert value(samples, "rmqpy_send_latency_seconds_bucket", flush_mode="ASYNC_FLUSH", le="+Inf") == sent // 20
    assert value(samples, "rmqpy_requests_total", op="send") == sent // 20
    # the log's offsets, and the flusher's timings of them
    confirmed = value(samples, "rmqpy_log_offset_bytes", offset="confirmed")
    assert confirmed > 0 and value(samples, "rmqpy_log_offset_bytes", offset="written") >= confirmed
    assert value(samples, "rmqpy_flush_seconds_count") >= 1
    assert value(samples, "rmqpy_fdatasync_seconds_count") >= 1
    # the actors, as the supervisor sees them
    for actor in ("writer", "flusher", "owner-0", "owner-1", "index", "reput", "front", "monitor"):
        assert value(samples, "rmqpy_actor_up", actor=actor) == 1
        assert value(samples, "rmqpy_actor_state", actor=actor, state="RUNNING") == 1
        assert value(samples, "rmqpy_actor_restarts_total", actor=actor) == 0
        assert value(samples, "rmqpy_actor_resident_memory_bytes", actor=actor) > 1_000_000
    assert 0 < value(samples, "rmqpy_disk_used_ratio") < 1
    assert value(samples, "rmqpy_disk_full") == 0


def test_pop_groups_show_what_is_in_flight_and_redelivered(monitored: Monitored) -> None:
    with monitored.engine.client() as client:
        client.create_topic("work", queue_count=1)
        client.send("work", [{"body": b"job %d" % i} for i in range(10)])
        wait_dispatched(client)  # a pop sees what the reput dispatcher has put in the queue
        popped = client.pop("workers", "work", max_messages=4, invisible_ms=60_000)
        assert len(popped) == 4
        client.ack("workers", popped[:1])
        client.nack("workers", popped[1])  # due again at once
        taken: list[dict] = []
        while popped[1]["queue_offset"] not in [m["queue_offset"] for m in taken]:  # a long poll each turn
            taken += client.pop("workers", "work", max_messages=10, invisible_ms=60_000, max_wait_ms=2_000)
        assert len(taken) == 7  # the 6 never popped, and the one nacked
    labels = {"group": "workers", "topic": "work", "queue_id": "0"}
    samples = monitored.wait_scrape(lambda s: value(s, "rmqpy_pop_redelivered_messages_total", **labels) == 1)
    assert value(samples, "rmqpy_pop_in_flight_messages", **labels) == 9
    assert value(samples, "rmqpy_pop_due_messages", **labels) == 0


def test_the_metrics_port_serves_only_metrics(monitored: Monitored) -> None:
    import urllib.error
    import urllib.request

    base = monitored.metrics_url.removesuffix("/metrics")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(base + "/api/overview", timeout=5)
    assert refused.value.code == 404
    # the dashboard's port serves the same figures
    samples = monitored.scrape(url=monitored.dashboard_url + "/metrics")
    assert value(samples, "rmqpy_actor_up", actor="monitor") == 1


@pytest.mark.parametrize(("changes", "message"), [
    ({"metrics_endpoint": "0.0.0.0:9108"}, "not a loopback address"),
    ({"dashboard_endpoint": "10.1.2.3:8080"}, "not a loopback address"),
    ({"metrics_endpoint": "localhost"}, "must be host:port"),
    ({"metrics_endpoint": "127.0.0.1:9200", "dashboard_endpoint": "127.0.0.1:9200"}, "must differ"),
    ({"metrics_report_interval_ms": 0}, "must be positive"),
])
def test_monitor_endpoints_are_checked_like_the_others(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        StoreConfig(**changes).validate()
    StoreConfig(metrics_endpoint="0.0.0.0:9108", bind_non_loopback=True).validate()
    StoreConfig(metrics_endpoint="", dashboard_endpoint="").validate()


def test_every_metric_is_documented() -> None:
    from pathlib import Path

    from engine.metrics.families import COUNTER, FAMILIES

    documented = Path(__file__).parents[2].joinpath("docs", "metrics.md").read_text()
    for family in FAMILIES.values():
        name = family.name + ("_total" if family.kind == COUNTER else "")
        assert f"| `{name}` | {family.kind} |" in documented, f"{name} is not in docs/metrics.md"


def test_disk_used_is_dfs_figure_and_the_one_the_writer_refuses_sends_at(monitored: Monitored) -> None:
    """One definition: the metric, the dashboard and the writer's DISK_FULL ratio are df's Use%."""
    store = monitored.engine.store_dir
    samples = monitored.scrape()
    used, available = map(int, subprocess.run(["df", "--output=used,avail", "-B1", str(store)], check=True,
                                              capture_output=True, text=True).stdout.split()[-2:])
    assert value(samples, "rmqpy_disk_used_ratio") == pytest.approx(used / (used + available), abs=0.01)
    assert value(samples, "rmqpy_disk_free_bytes") == pytest.approx(available, rel=0.01)
    assert disk_used_ratio(store) == pytest.approx(used / (used + available), abs=0.01)  # the writer's


def test_under_sync_flush_the_writer_times_its_own_syncs(store_dir: Path) -> None:
    with monitored_engine(store_dir, flush_mode="SYNC_FLUSH") as monitored, monitored.engine.client() as client:
        for n in range(10):
            client.send(TOPIC, [{"body": b"durable %d" % n}], queue_id=0)
        samples = monitored.wait_scrape(lambda s: value(s, "rmqpy_flush_seconds_count") >= 10)
        assert value(samples, "rmqpy_flush_seconds_sum") > 0
        assert value(samples, "rmqpy_send_latency_seconds_count", flush_mode="SYNC_FLUSH") == 10
        # one histogram of the log's flushes: the writer's; the flusher reports none in this mode
        assert not any(name == "rmqpy_fdatasync_seconds_count" for name, _labels in samples)
