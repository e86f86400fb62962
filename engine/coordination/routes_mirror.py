"""The cluster's topic routes as the front reads them: a file of the run directory that the broker
membership actor keeps (``engine/coordination/routes.py``), read here without etcd's client, so
that a front starts without loading it (about 50 ms of imports a restart)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROUTES_MIRROR_FILE = "cluster-routes.json"  # in the run directory: the membership actor writes it


class RoutesMirror:
    """The front's reader of the mirror file: re-read when it changed, at most once a lookup."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / ROUTES_MIRROR_FILE
        self.stamp: tuple[int, int] | None = None
        self.content: dict[str, Any] = {"topics": {}, "masters": {}, "grpc": {}}

    def _fresh(self) -> dict[str, Any]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return self.content
        if (stat.st_mtime_ns, stat.st_size) != self.stamp:
            try:
                self.content = json.loads(self.path.read_text())
                self.stamp = (stat.st_mtime_ns, stat.st_size)
            except (OSError, ValueError):
                pass  # being replaced: the next lookup reads it
        return self.content

    def serving(self, topic: str) -> dict[str, dict[str, Any]]:
        """The broker sets serving ``topic`` by the cluster's routes: name -> {queues, master_endpoint,
        grpc_endpoint} (the master's gRPC endpoint, "" if it has none)."""
        content = self._fresh()
        masters, grpc = content["masters"], content.get("grpc", {})
        return {broker: {"queues": queues, "master_endpoint": masters.get(broker, ""),
                         "grpc_endpoint": grpc.get(broker, "")}
                for broker, queues in sorted(content["topics"].get(topic, {}).items())}

    def grpc_endpoint(self, broker: str) -> str:
        return str(self._fresh().get("grpc", {}).get(broker, ""))
