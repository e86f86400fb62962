"""One engine of a local cluster (``cluster.py``) at a time: started detached on its own config, as
``cluster start`` starts each, or stopped, by the name ``cluster status`` prints; and what of a
cluster runs, so that ``cluster start`` does not start one twice.

Exit statuses are ``rmqpy-server``'s (docs/operations.md, 1.1): an unknown name is a usage error,
an engine already running is 4 (as ``start`` on a store in use), one already stopped 3 (as ``stop``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import psutil

from engine.ipc.control import NotRunning, supervisor_state
from supervisor.cluster_status import CLUSTER_FILE, read_cluster
from supervisor.etcd_server import ETCD

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_RUNNING, EXIT_RUNNING = 0, 1, 2, 3, 4


def running(directory: Path) -> str:
    """What of the cluster in ``directory`` runs ("" : nothing, or no cluster there): its engines'
    supervisors and its etcd members, by pid."""
    if not (directory / CLUSTER_FILE).exists():
        return ""
    cluster = read_cluster(directory)
    alive = []
    for engine in cluster["engines"]:
        try:
            alive.append(f"{engine['name']} (pid {supervisor_state(Path(engine['store_dir']))['pid']})")
        except NotRunning:
            continue
    for pid in cluster.get("etcd_pids", []):
        try:
            if psutil.Process(pid).name() == ETCD:
                alive.append(f"etcd (pid {pid})")
        except psutil.Error:
            continue
    return ", ".join(alive)


def start_engines(directory: Path, engines: list[dict[str, str]]) -> int:
    """Each engine in turn, detached (``start --detach`` returns once it serves), until one fails."""
    for engine in engines:
        started = subprocess.run([sys.executable, "-m", "supervisor", "start", "--config",
                                  str(directory / f"{engine['name']}.toml"), "--store-dir", engine["store_dir"],
                                  "--detach"], capture_output=True, text=True, check=False)
        if started.returncode != 0:
            print(f"error: {engine['name']} did not start: {started.stderr.strip()}", file=sys.stderr)
            return started.returncode
        print(f"{engine['name']:<10} {engine['endpoint']:<24} store={engine['store_dir']}", flush=True)
    return EXIT_OK


def named(args: argparse.Namespace) -> dict[str, str] | None:
    engines: list[dict[str, str]] = read_cluster(args.dir.resolve())["engines"]
    for engine in engines:
        if engine["name"] == args.name:
            return engine
    print(f"error: no engine {args.name!r} in the cluster in {args.dir.resolve()} (its engines: "
          f"{', '.join(engine['name'] for engine in engines)})", file=sys.stderr)
    return None


def start_engine(args: argparse.Namespace) -> int:
    engine = named(args)
    if engine is None:
        return EXIT_USAGE
    try:
        pid = supervisor_state(Path(engine["store_dir"]))["pid"]
    except NotRunning:
        return start_engines(args.dir.resolve(), [engine])
    print(f"error: {engine['name']} is already running (pid {pid}) on {engine['endpoint']}", file=sys.stderr)
    return EXIT_RUNNING


def stop_engine(args: argparse.Namespace) -> int:
    engine = named(args)
    if engine is None:
        return EXIT_USAGE
    try:
        supervisor_state(Path(engine["store_dir"]))
    except NotRunning:
        print(f"{engine['name']} is not running (already stopped)")
        return EXIT_NOT_RUNNING
    return stop_one(engine)


def stop_one(engine: dict[str, str]) -> int:
    """``stop`` of the engine's store: its line printed, its status returned."""
    stopped = subprocess.run([sys.executable, "-m", "supervisor", "stop", "--store-dir", engine["store_dir"]],
                             capture_output=True, text=True, check=False)
    print(f"{engine['name']:<10} {(stopped.stdout or stopped.stderr).strip()}")
    return stopped.returncode
