"""The monitor: the engine's metrics for Prometheus (``metrics_endpoint``) and its web
dashboard (``dashboard_endpoint``), each served over HTTP (``engine/dashboard/server.py``).

It writes no file of the store and holds nothing that outlives it but the last minutes of
rates, which a restart starts again: a monitor that crashes or is killed costs a gap in
the dashboard's charts and a failed scrape, never a message. Nothing waits on it: the
actors leave their figures in report files (``engine/metrics/report.py``) whether or not
it reads them, and its searches are plain reads through the front's internal port.

Figures are gathered when asked for (``engine/metrics/collector.py``); once a second the
tick keeps the messages sent and pulled so far, for the dashboard's charts of rates.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry

from engine.actors.base import Actor, Env, main
from engine.actors.effects import Effects
from engine.dashboard import api
from engine.dashboard.server import Dashboard, Servers, start_servers
from engine.metrics.collector import EngineCollector
from engine.metrics.report import read_reports

log = logging.getLogger(__name__)
RATES_KEPT_S = 600


class MonitorActor(Actor):
    tick_interval_ms = 1_000

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineCollector(env.store_dir, env.run_dir, env.config))
        self.rates = api.Rates(RATES_KEPT_S)
        self.dashboard = Dashboard(env.store_dir, env.run_dir, env.config, self.registry, self.rates)
        self.servers: Servers | None = None

    def recover(self, out: Effects) -> None:
        self.servers = start_servers(self.dashboard, self.config)  # OSError (a port in use): the process ends

    def tick(self, out: Effects) -> None:
        if not self.config.dashboard_endpoint:
            return
        sent = pulled = 0
        for report in read_reports(self.env.run_dir):
            sent += sum(row[-1] for row in report.samples.get("rmqpy_queue_sent_messages", ()))
            pulled += sum(row[-1] for row in report.samples.get("rmqpy_queue_pulled_messages", ()))
        self.rates.sample((sent, pulled), self.clock.wall_ms(), self.clock.mono_ms())

    def shutdown(self, out: Effects) -> None:
        if self.servers is not None:
            self.servers.stop()


if __name__ == "__main__":
    raise SystemExit(main(MonitorActor))
