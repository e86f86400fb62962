"""A Spark standalone cluster on loopback, from pyspark's own launcher: a master and N workers.

    with spark_standalone(root, workers=2) as master_url:      # spark://127.0.0.1:<port>
        build_session(master=master_url) ...

pyspark's package carries ``bin/spark-class``: ``org.apache.spark.deploy.master.Master`` and
``...worker.Worker`` start from it with no other download. Each process logs under ``root``;
the cluster is up once the master's JSON status lists every worker ALIVE, and stopping it
SIGTERMs the workers, then the master, and waits for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark

from supervisor.launcher import free_port

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
_MASTER = "org.apache.spark.deploy.master.Master"
_WORKER = "org.apache.spark.deploy.worker.Worker"


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as answer:
            status = json.load(answer)
    except OSError:
        return 0
    return sum(1 for worker in status.get("workers", []) if worker.get("state") == "ALIVE")


@contextmanager
def spark_standalone(root: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g",
                     timeout_s: float = 120.0) -> Iterator[str]:
    """The master's URL, once ``workers`` workers (``cores`` each) are registered with it."""
    root.mkdir(parents=True, exist_ok=True)
    port, ui_port = free_port(), free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(root / "work"),
           "PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1"}
    processes: list[subprocess.Popen[bytes]] = []
    logs = []

    def start(name: str, *args: str) -> None:
        log = (root / f"{name}.log").open("wb")
        logs.append(log)
        processes.append(subprocess.Popen([str(SPARK_CLASS), *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True))

    try:
        start("master", _MASTER, "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port))
        url = f"spark://127.0.0.1:{port}"
        for k in range(workers):
            start(f"worker-{k}", _WORKER, "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
                  "--webui-port", str(free_port()), url)
        deadline = time.monotonic() + timeout_s
        while _alive_workers(ui_port) < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                raise RuntimeError(f"the Spark standalone cluster did not come up in {timeout_s} s: see {root}/*.log")
            time.sleep(0.2)
        yield url
    finally:
        for process in reversed(processes):  # the workers, then the master
            process.terminate()
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
