"""An engine with the monitor on: Prometheus' endpoint and the dashboard on free loopback ports."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.config import StoreConfig
from supervisor.launcher import EngineProcess, free_port

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Monitored:
    engine: EngineProcess
    metrics_url: str
    dashboard_url: str

    def scrape(self, *, url: str | None = None) -> Samples:
        """Every sample of one scrape, by (name, sorted labels)."""
        with urllib.request.urlopen(url or self.metrics_url, timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def api(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.dashboard_url + path, timeout=15) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def wait_scrape(self, condition: Callable[[Samples], bool], *, timeout_s: float = 20) -> Samples:
        """Scrape until ``condition`` holds (the actors report once a second); fail at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                samples = self.scrape()
            except (urllib.error.URLError, ConnectionError):  # the monitor is restarting
                samples = {}
            if samples and condition(samples):
                return samples
            assert time.monotonic() < deadline, f"no scrape met the condition within {timeout_s} s"
            time.sleep(0.1)  # a poll interval, not a wait for state: the condition decides


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over every series whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def monitor_config(**changes: object) -> StoreConfig:
    return StoreConfig.test_min().replace(metrics_endpoint=f"127.0.0.1:{free_port()}",
                                          dashboard_endpoint=f"127.0.0.1:{free_port()}", metrics_report_interval_ms=200,
                                          **changes)


@contextmanager
def monitored_engine(store_dir: Path, **changes: object) -> Iterator[Monitored]:
    """An engine with metrics and the dashboard on free ports (``monitor_config(**changes)``)."""
    config = monitor_config(**changes)
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    try:
        yield Monitored(engine, f"http://{config.metrics_endpoint}/metrics", f"http://{config.dashboard_endpoint}")
    finally:
        engine.stop()


@pytest.fixture
def monitored(store_dir: Path) -> Iterator[Monitored]:
    with monitored_engine(store_dir) as monitored:
        yield monitored
