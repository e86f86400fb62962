"""``cluster status``: each engine of a local cluster and each member of its etcd, as text or JSON.

An engine's row comes from its supervisor (the state file's pid, the status reply's offsets and
actors), so nothing is asked over the network but etcd's health: state ``STOPPED`` with the
reason, or the state, the role, the pid, the epoch (elected on etcd), the master of its broker
set (the running engine of the set whose role is master, the newest epoch's if two say so) and
its lag: ``behind_bytes``, the bytes its log ends before the master's (``written_offset``, the
master's max offset), 0 for the master itself. An etcd member's row is ``member_health``'s.
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

from engine.coordination.etcd import EtcdTls
from engine.ipc.control import ControlTimeout, NotRunning, control, supervisor_state
from engine.ipc.messages import StatusQuery
from supervisor.etcd_server import member_health

CLUSTER_FILE = "cluster.json"
STATUS_TIMEOUT_MS = 2_000  # one engine's status answer


def read_cluster(directory: Path) -> dict[str, Any]:
    """``cluster.json`` of ``directory``; exits (status 1) naming the command that makes one if none."""
    try:
        cluster: dict[str, Any] = json.loads((directory / CLUSTER_FILE).read_text())
    except FileNotFoundError:
        raise SystemExit(f"error: no cluster in {directory} (cluster start --dir {directory})") from None
    return cluster


def engine_rows(engines: list[dict[str, str]]) -> list[dict[str, object]]:
    rows = [_engine_row(engine) for engine in engines]
    for broker_name in {row["broker_name"] for row in rows}:
        members = [row for row in rows if row["broker_name"] == broker_name]
        masters = [row for row in members if row.get("role") == "master"]
        master = max(masters, key=lambda row: int(str(row.get("epoch", 0)))) if masters else None
        for row in members:
            if row["state"] == "STOPPED":
                continue
            row["master"] = master["name"] if master is not None else None
            row["behind_bytes"] = None if master is None else \
                max(0, int(str(master["log_end"])) - int(str(row["log_end"])))
    return rows


def _engine_row(engine: dict[str, str]) -> dict[str, object]:
    row: dict[str, object] = {"name": engine["name"], "endpoint": engine["endpoint"],
                              "store_dir": engine["store_dir"], "broker_name": engine.get("broker_name")}
    try:
        pid = supervisor_state(Path(engine["store_dir"]))["pid"]
        reply = control(Path(engine["store_dir"]), StatusQuery(), timeout_ms=STATUS_TIMEOUT_MS)
    except (NotRunning, ControlTimeout) as exc:
        row.update(state="STOPPED", reason=str(exc))
        return row
    role = "replica" if "replication-receiver" in {actor.name for actor in reply.actors} else "master"
    row.update(state=reply.state, role=role, pid=pid, log_end=reply.offsets.get("written_offset", 0),
               confirmed_offset=reply.offsets.get("confirmed_offset", 0))
    if reply.offsets.get("epoch"):
        row["epoch"] = reply.offsets["epoch"]
    if role == "master":
        row["in_sync_replicas"] = reply.offsets.get("in_sync_replicas", 0)
    return row


def operator_context(cluster: dict[str, Any]) -> ssl.SSLContext | None:
    """TLS to a secure cluster's etcd (``cluster start`` without ``--insecure``) with the operator's certificate."""
    tls = cluster.get("etcd_tls")
    return EtcdTls(**tls).context() if tls else None


def etcd_rows(cluster: dict[str, Any]) -> list[dict[str, object]]:
    """Each etcd member the cluster's engines use (``etcd_endpoints``), with its pid if started here."""
    endpoints = [url for url in str(cluster.get("etcd_endpoints", "")).split(",") if url]
    pids: list[int] = cluster.get("etcd_pids", [])
    rows: list[dict[str, object]] = []
    context = operator_context(cluster)
    for k, endpoint in enumerate(endpoints):
        health = member_health(endpoint, context=context)
        row: dict[str, object] = {"name": f"etcd-{k}", "endpoint": endpoint,
                                  "pid": pids[k] if k < len(pids) else None, "up": health.up,
                                  "healthy": health.healthy, "leader": health.leader}
        if not health.up:
            row["reason"] = health.reason
        rows.append(row)
    return rows


def status_lines(engines: list[dict[str, object]], etcd: list[dict[str, object]]) -> list[str]:
    lines = []
    for row in engines:
        where = f"{row['name']:<10} {row['endpoint']:<24}"
        if row["state"] == "STOPPED":
            lines.append(f"{where} not running ({row['reason']})")
            continue
        epoch = f" epoch={row['epoch']}" if "epoch" in row else ""
        isr = f" in_sync_replicas={row['in_sync_replicas']}" if row["role"] == "master" else ""
        behind = "?" if row["behind_bytes"] is None else row["behind_bytes"]
        lines.append(f"{where} {row['state']:<9} {row['role']:<8} pid={row['pid']} log_end={row['log_end']}{epoch}"
                     f" master={row['master'] or '-'} behind_bytes={behind}{isr}")
    for row in etcd:
        where = f"{row['name']:<10} {row['endpoint']:<24}"
        if not row["up"]:
            lines.append(f"{where} down     pid={row['pid'] or '-'} ({row['reason']})")
            continue
        health = ("leader" if row["leader"] else "follower") if row["healthy"] else "no-leader"
        lines.append(f"{where} up       pid={row['pid'] or '-'} {health}")
    return lines
