"""A real Prometheus scrapes a cluster of two broker sets and evaluates deploy/prometheus/alerts.yml.

The cluster (``harness.broker_set.cluster_of_sets``: a master and a replica a set, elected on one
etcd) gives each engine its own metrics endpoint; Prometheus (Debian's ``prometheus``) is started
on a free port with a config listing them and the repository's rule file, unchanged. Everything is
read through Prometheus's HTTP API: the targets, the engines' figures, the alerts. Killing a set's
master leaves it without one until its replica's election: the lease is 4 s here, so that window
outlasts several scrapes and evaluations, and ``RmqpyBrokerSetWithoutMaster`` goes pending.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from engine.config import StoreConfig
from harness.broker_set import BrokerSet, cluster_of_sets, wait_in_sync
from supervisor.etcd_server import ETCD
from supervisor.launcher import free_port
from tests.helpers import require

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
ALERT = "RmqpyBrokerSetWithoutMaster"
T = TypeVar("T")


class Prometheus:
    """Prometheus's HTTP API (``/api/v1``), as a dashboard or alertmanager reads it."""

    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("query", query=expr)["result"]
        return result

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return [alert for alert in self.get("alerts")["alerts"] if alert["labels"]["alertname"] == name]


@contextmanager
def prometheus(root: Path, targets: list[str]) -> Iterator[Prometheus]:
    """``prometheus`` scraping ``targets`` every second with the repository's rules, stopped at the end."""
    tool = shutil.which("prometheus")
    require(tool is not None, "prometheus (Debian's prometheus)")
    assert tool is not None
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "500ms"},
              "rule_files": [str(RULES)],
              "scrape_configs": [{"job_name": "rmqpy", "static_configs": [{"targets": targets}]}]}
    (root / "prometheus.yml").write_text(json.dumps(config, indent=2))  # JSON is YAML
    address = f"127.0.0.1:{free_port()}"
    with (root / "prometheus.out").open("wb") as out:
        process = subprocess.Popen([tool, f"--config.file={root / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address={address}",
                                    "--log.level=warn"], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        api = Prometheus(f"http://{address}")
        wait_for(lambda: _ready(api.url), "prometheus to be ready", timeout_s=60)
        yield api
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False


def wait_for(probe: Callable[[], T | None], what: str, *, timeout_s: float) -> T:
    """``probe()`` until it answers something truthy; fail at the deadline, saying what was awaited."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = probe()
        if answer:
            return answer
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.1)  # a poll interval: Prometheus scrapes and evaluates in its own process


def masters(api: Prometheus) -> dict[str, list[str]]:
    """Broker set -> the instances whose ``rmqpy_broker_master`` is 1, as Prometheus last scraped."""
    found: dict[str, list[str]] = {}
    for sample in api.query("rmqpy_broker_master"):
        found.setdefault(sample["metric"]["broker_name"], [])
        if sample["value"][1] == "1":
            found[sample["metric"]["broker_name"]].append(sample["metric"]["instance"])
    return found


def test_prometheus_scrapes_every_engine_and_a_set_that_loses_its_master_raises_the_alert(tmp_path: Path) -> None:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    # A replica spawns its master's actors when it is elected (standby_master_actors off): the four
    # engines run half the processes, and the window without master grows by their start.
    config = StoreConfig.test_min().replace(metrics_endpoint="127.0.0.1:9108", master_lease_ms=4_000,
                                            auto_create_topic=False, standby_master_actors=False)
    with cluster_of_sets(tmp_path / "cluster", config, sets=2, engines=2) as brokers:
        engines = {engine.config.metrics_endpoint: engine for broker_set in brokers for engine in broker_set.engines}
        first: dict[str, BrokerSet] = {}
        for name, broker_set in zip(("broker-a", "broker-b"), brokers, strict=True):
            wait_in_sync(broker_set.wait_master(), 1)  # the replica can be elected
            first[name] = broker_set
        with prometheus(tmp_path, sorted(engines)) as api:
            def all_up() -> list[dict[str, Any]] | None:
                active = api.get("targets", state="active")["activeTargets"]
                return active if len(active) == len(engines) and all(t["health"] == "up" for t in active) else None

            targets = wait_for(all_up, "target of the four up", timeout_s=90)
            assert {t["labels"]["instance"] for t in targets} == set(engines)
            written = {s["metric"]["instance"] for s in api.query('rmqpy_log_offset_bytes{offset="written"}')}
            assert written == set(engines), written  # a figure of each engine, through Prometheus

            def one_master_each() -> dict[str, list[str]] | None:
                seen = masters(api)
                return seen if sorted(seen) == ["broker-a", "broker-b"] and all(
                    len(m) == 1 for m in seen.values()) else None

            before = wait_for(one_master_each, "single master in each set", timeout_s=60)
            assert api.query(f'ALERTS{{alertname="{ALERT}", alertstate="firing"}}') == []

            old = engines[before["broker-a"][0]]
            assert old is first["broker-a"].master()
            killed_at = time.time()
            old.kill()

            def raised() -> list[dict[str, Any]] | None:
                """The alert, pending or firing, for broker-a: as /api/v1/alerts shows it now, or as
                the ALERTS series kept it since the kill (the window can close between two polls)."""
                now = [a for a in api.alerts(ALERT) if a["labels"]["broker_name"] == "broker-a"]
                since = f"{max(1, int(time.time() - killed_at) + 1)}s"
                kept = api.query(f'max_over_time(ALERTS{{alertname="{ALERT}", broker_name="broker-a"}}[{since}])')
                return now or kept

            alert = wait_for(raised, f"{ALERT} for broker-a", timeout_s=60)
            state = alert[0].get("state") or alert[0]["metric"]["alertstate"]
            assert state in ("pending", "firing"), alert

            new = first["broker-a"].wait_master(other_than=old, timeout_s=60)
            wait_for(lambda: masters(api).get("broker-a") == [new.config.metrics_endpoint] or None,
                     "new master of broker-a in Prometheus", timeout_s=60)
            wait_for(lambda: not any(a["labels"]["broker_name"] == "broker-a" for a in api.alerts(ALERT)) or None,
                     f"end of {ALERT} once broker-a elected its replica", timeout_s=60)
            assert masters(api)["broker-b"] == before["broker-b"]
