"""The monitor's HTTP servers: ``/metrics`` for Prometheus, and the dashboard.

Both are bounded servers (``http.py``): a few workers answer whole requests, so a slow
scrape never holds the page back, and a burst of connections is cut to
``http_connections_max`` rather than costing the monitor its heartbeat. The metrics
endpoint serves only ``/metrics`` and ``/healthz``; the dashboard endpoint serves the page,
its JSON (``/api/...``), ``/metrics`` and ``/healthz`` too.

    GET /                      the page (static/index.html)
    GET /static/NAME           its script and style
    GET /api/overview          state, actors, log offsets, disk
    GET /api/topics            topics and their queues
    GET /api/groups            consumer groups (lag) and pop groups (in flight)
    GET /api/rates             messages sent and pulled a second, the last minutes
    GET /api/search?topic=T&key=K | ?msg_id=ID | ?topic=T&time_ms=MS
    GET /metrics               Prometheus' text format
    GET /healthz               200 when the engine is RUNNING, else 503 and its reasons
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from engine.client import EngineError, RequestTimeout, StoreClient
from engine.config import StoreConfig
from engine.dashboard import api
from engine.dashboard.http import BoundedHTTPServer, PrereadHandler, serve_in_thread
from engine.ipc import endpoints
from engine.metrics.collector import View, gather, supervisor_status
from engine.store.shared_offsets import SharedOffsets

log = logging.getLogger(__name__)
_STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
           "style.css": "text/css; charset=utf-8"}
_FRONT_TIMEOUT_MS = 5_000
_json = msgspec.json.Encoder()


class SharedScrape:
    """``/metrics``, gathered by one request at a time: those that ask while it runs take the
    next one's answer rather than each gathering their own (a scrape reads every report and
    asks the supervisor for its status, so a hundred of them at once would crowd out the
    monitor's loop and load the supervisor)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.lock = threading.Lock()
        self.body = b""
        self.started = float("-inf")

    def latest(self) -> bytes:
        asked = time.monotonic()
        with self.lock:
            if self.started < asked:  # none began since this request came: gather afresh
                self.started = time.monotonic()
                self.body = generate_latest(self.registry)
            return self.body


class Dashboard:
    """What the routes answer from: the store, its run directory and the recent rates."""

    def __init__(self, store_dir: Path, run_dir: Path, config: StoreConfig, registry: CollectorRegistry,
                 rates: api.Rates) -> None:
        self.store_dir = store_dir
        self.run_dir = run_dir
        self.config = config
        self.registry = registry
        self.rates = rates
        self.offsets = SharedOffsets(run_dir)
        self.scrape = SharedScrape(registry)

    def view(self) -> View:
        return gather(self.store_dir, self.run_dir, self.config, self.offsets)

    def front(self) -> StoreClient:
        return StoreClient(endpoints.ipc(self.run_dir, endpoints.FRONT_INTERNAL), timeout_ms=_FRONT_TIMEOUT_MS)

    def listed_topics(self, client: StoreClient) -> list[dict[str, Any]]:
        return client.list_topics()

    def answer(self, path: str, query: dict[str, str]) -> Any:
        if path == "/api/overview":
            with self.front() as client:
                count = len(self.listed_topics(client))
            return api.overview(self.view(), self.config.flush_mode, count)
        if path == "/api/topics":
            with self.front() as client:
                listed = self.listed_topics(client)
            return api.topics(self.view(), listed)
        if path == "/api/groups":
            return api.groups(self.view())
        if path == "/api/rates":
            return api.rates_answer(self.rates)
        if path == "/api/search":
            return self.search(query)
        raise LookupError(path)

    def search(self, query: dict[str, str]) -> list[dict[str, Any]]:
        topic = query.get("topic", "")
        with self.front() as client:
            queue_count = 0
            if "time_ms" in query:
                queue_count = next((t["queue_count"] for t in self.listed_topics(client) if t["topic"] == topic), 0)
                if not queue_count:
                    raise ValueError(f"no topic {topic!r}")
            time_ms = int(query["time_ms"]) if "time_ms" in query else None
            return api.search(client, topic=topic, key=query.get("key", ""), msg_id=query.get("msg_id", ""),
                              time_ms=time_ms, queue_count=queue_count)


def health(store_dir: Path) -> tuple[int, bytes]:
    """``/healthz``: 200 and ``RUNNING`` when every actor runs and can do its work; else 503,
    the engine's state and its reasons, a line each: each actor that does not run with its
    state (``writer RECOVERING``, ``front GAVE_UP``), each that reports a condition
    (``writer: cannot append: disk full (need 4160 bytes, 0 free)``); or why the supervisor
    gave no status. A load balancer or systemd reads the code."""
    status = supervisor_status(store_dir)
    if status is None:
        return 503, b"UNKNOWN\nno status from the supervisor\n"
    if status.state == "RUNNING" and not status.reasons:
        return 200, b"RUNNING\n"
    return 503, (f"{status.state}\n" + "".join(f"{reason}\n" for reason in status.reasons)).encode()


def _handler(dashboard: Dashboard, *, pages: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(PrereadHandler):
        server_version = "rmqpy-monitor"

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            path = url.path
            if path == "/metrics":
                self.reply(200, CONTENT_TYPE_LATEST, dashboard.scrape.latest())
            elif path == "/healthz":
                status, body = health(dashboard.store_dir)
                self.reply(status, "text/plain; charset=utf-8", body)
            elif not pages:
                self.reply(404, "text/plain", b"only /metrics and /healthz are served here\n")
            elif path == "/" or path.startswith("/static/"):
                name = "index.html" if path == "/" else path.removeprefix("/static/")
                if name not in _STATIC:
                    self.reply(404, "text/plain", b"no such file\n")
                    return
                body = resources.files("engine.dashboard").joinpath("static", name).read_bytes()
                self.reply(200, _STATIC[name], body)
            elif path.startswith("/api/"):
                self.api(path, {k: v[-1] for k, v in parse_qs(url.query).items()})
            else:
                self.reply(404, "text/plain", b"not found\n")

        def api(self, path: str, query: dict[str, str]) -> None:
            try:
                body, status = dashboard.answer(path, query), 200
            except LookupError:
                body, status = {"error": {"name": "NOT_FOUND", "message": f"no page {path}"}}, 404
            except (ValueError, KeyError) as exc:
                body, status = {"error": {"name": "BAD_REQUEST", "message": str(exc)}}, 400
            except EngineError as exc:
                body, status = {"error": {"code": exc.code, "name": exc.name, "message": exc.message}}, 400
            except RequestTimeout as exc:
                body, status = {"error": {"name": "TIMEOUT", "message": str(exc)}}, 503
            self.reply(status, "application/json", _json.encode(body))

        def reply(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return Handler


class Servers:
    """The HTTP servers of the monitor, each on its own thread (``http.py``: bounded)."""

    def __init__(self) -> None:
        self.stops: list[Callable[[], None]] = []

    def start(self, endpoint: str, handler: type[BaseHTTPRequestHandler], config: StoreConfig) -> None:
        host, _, port = endpoint.rpartition(":")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server = BoundedHTTPServer((host.strip("[]"), int(port)), handler, family=family,
                                   connections_max=config.http_connections_max,
                                   request_timeout_ms=config.http_request_timeout_ms,
                                   workers_max=config.http_workers_max)
        self.stops.append(serve_in_thread(server, f"http {endpoint}"))
        log.info("serving http://%s/", endpoint)

    def stop(self) -> None:
        for stop in self.stops:
            stop()


def start_servers(dashboard: Dashboard, config: StoreConfig) -> Servers:
    servers = Servers()
    if config.metrics_endpoint:
        servers.start(config.metrics_endpoint, _handler(dashboard, pages=False), config)
    if config.dashboard_endpoint:
        servers.start(config.dashboard_endpoint, _handler(dashboard, pages=True), config)
    return servers
