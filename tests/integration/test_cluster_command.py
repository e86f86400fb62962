"""``rmqpy-server cluster``: a master and two replicas started by one command, their roles and lag
shown, a message sent to the master read from a replica, and all of it stopped by one command; a
cluster of two broker sets on an etcd of three members, grown by a third with ``cluster add``; one
engine stopped and started again by name, and what ``cluster status`` says of the engines and of
each etcd member meanwhile."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from engine.client import EngineError, StoreClient
from engine.errors import ErrorCode
from supervisor.etcd_server import ETCD
from supervisor.launcher import free_port
from tests.helpers import require

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]  # three engines started and stopped: 14 s


def cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "cluster", *args], capture_output=True, text=True,
                          timeout=90, check=False)


def test_one_command_starts_a_master_and_its_replicas_and_one_stops_them(tmp_path: Path) -> None:
    port = free_port()
    directory = tmp_path / "cluster"
    started = cluster("start", "--insecure", "--dir", str(directory), "--replicas", "2", "--port", str(port))
    try:
        assert started.returncode == 0, started.stderr
        assert [line.split()[0] for line in started.stdout.splitlines()[:3]] == ["master", "replica-1", "replica-2"]
        with StoreClient(f"tcp://127.0.0.1:{port}") as master:
            master.send("demo", [{"body": b"hello", "keys": ["k1"]}])
        deadline = time.monotonic() + 30
        found: list[dict[str, object]] = []
        with StoreClient(f"tcp://127.0.0.1:{port + 20}") as replica:
            while not found:
                assert time.monotonic() < deadline, "the replica never served the master's message"
                try:
                    found = replica.query_by_key("demo", "k1")
                except Exception:
                    continue
        assert found[0]["body"] == b"hello"
        shown = cluster("status", "--dir", str(directory))
        roles = [line.split()[3] for line in shown.stdout.splitlines()]
        assert roles == ["master", "replica", "replica"], shown.stdout
    finally:
        stopped = cluster("stop", "--dir", str(directory))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert [line.split()[1] for line in stopped.stdout.splitlines()] == ["stopped"] * 3


def test_one_command_starts_a_cluster_of_two_broker_sets_and_a_topic_spreads_over_them(tmp_path: Path) -> None:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    port, etcd_port = free_port(), free_port()
    directory = tmp_path / "cluster"
    started = cluster("start", "--insecure", "--dir", str(directory), "--broker-sets", "2", "--replicas", "0",
                      "--port", str(port), "--etcd-port", str(etcd_port))
    try:
        assert started.returncode == 0, started.stderr
        names = [line.split()[0] for line in started.stdout.splitlines()[:5]]
        assert names == ["etcd-0", "etcd-1", "etcd-2", "broker-a-0", "broker-b-0"], started.stdout
        etcd_endpoints = ",".join(f"http://127.0.0.1:{etcd_port + 2 * k}" for k in range(3))
        for engine in ("broker-a-0", "broker-b-0"):  # every member, so that any one can be lost
            assert f'etcd_endpoints = "{etcd_endpoints}"' in (directory / f"{engine}.toml").read_text()
        with StoreClient(f"tcp://127.0.0.1:{port}") as broker_a, pytest.raises(EngineError) as refused:
            broker_a.send("orders", [{"body": b"before its creation"}])  # a send creates no topic on the set it reaches
        assert refused.value.code == ErrorCode.TOPIC_NOT_FOUND, refused.value
        etcd = f"http://127.0.0.1:{etcd_port}"
        created = rmqpy_cli("topics", "--cluster", etcd, "--create", "orders", "--queues", "6")
        assert created.returncode == 0, created.stderr
        assert created.stdout.splitlines() == [f"topic orders: 3 queues on broker-a (tcp://127.0.0.1:{port})",
                                               f"topic orders: 3 queues on broker-b (tcp://127.0.0.1:{port + 100})"]
        listed = rmqpy_cli("topics", "--cluster", etcd)
        assert "orders\tbroker-a: 3 queues, broker-b: 3 queues" in listed.stdout, listed.stdout

        added = cluster("add", "--dir", str(directory))  # growing: one command, one more set
        assert added.returncode == 0, added.stderr
        assert added.stdout.splitlines()[0].split()[:2] == ["broker-c-0", f"tcp://127.0.0.1:{port + 200}"]
        assert "existing queues stay where they are" in added.stdout
        created = rmqpy_cli("topics", "--cluster", etcd, "--create", "audit", "--queues", "2", "--brokers", "broker-c")
        assert created.returncode == 0, created.stderr
        grown = rmqpy_cli("topics", "--endpoint", f"tcp://127.0.0.1:{port + 200}", "--create", "orders",
                          "--queues", "2")  # orders gains 2 queues on the new set; its 6 others stay
        assert grown.returncode == 0, grown.stderr
        deadline = time.monotonic() + 30
        while "orders\tbroker-a: 3 queues, broker-b: 3 queues, broker-c: 2 queues" not in listed.stdout:
            assert time.monotonic() < deadline, listed.stdout
            listed = rmqpy_cli("topics", "--cluster", etcd)
        assert "audit\tbroker-c: 2 queues" in listed.stdout
        sent = rmqpy_cli("produce", "--cluster", etcd, "--topic", "orders", "--count", "8", "--json")
        assert sent.returncode == 0, sent.stderr
        assert {r["broker_name"] for r in json.loads(sent.stdout)["results"]} == {"broker-a", "broker-b", "broker-c"}
        for engine in json.loads((directory / "cluster.json").read_text())["engines"]:  # those added too
            assert "auto_create_topic = false" in (directory / f"{engine['name']}.toml").read_text().splitlines()
    finally:
        stopped = cluster("stop", "--dir", str(directory))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert [line.split()[1] for line in stopped.stdout.splitlines()] == ["stopped"] * 4


def rmqpy_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bad", [["start", "--broker-sets", "0"], ["start", "--broker-sets", "-3"],
                                 ["start", "--broker-sets", "abc"], ["start", "--replicas", "-1"],
                                 ["add", "--replicas", "-1"], ["start", "--etcd-members", "2"],
                                 ["start", "--etcd-members", "0"], ["start", "--etcd-members", "9"]])
def test_a_bad_count_is_a_usage_error_before_anything_is_written(tmp_path: Path, bad: list[str]) -> None:
    directory = tmp_path / "cluster"
    refused = cluster(bad[0], "--dir", str(directory), *bad[1:])
    assert refused.returncode == 2, (refused.returncode, refused.stderr)  # argparse's, as every command's
    assert "Traceback" not in refused.stderr
    assert f"argument {bad[1]}: " in refused.stderr.strip().splitlines()[-1], refused.stderr
    assert not directory.exists()


def supervisor_of(store_dir: str) -> int:
    """The pid of the background supervisor `start --detach` began on ``store_dir``, found among the processes."""
    [pid] = [p.pid for p in psutil.process_iter(["cmdline"])
             if (cmdline := p.info["cmdline"] or [])[1:4] == ["-m", "supervisor", "start"]
             and "--detached-child" in cmdline and cmdline[cmdline.index("--store-dir") + 1] == store_dir]
    return pid


def test_cluster_status_shows_each_supervisor_pid_and_says_the_same_in_json(tmp_path: Path) -> None:
    port = free_port()
    directory = tmp_path / "cluster"
    started = cluster("start", "--insecure", "--dir", str(directory), "--replicas", "1", "--port", str(port))
    try:
        assert started.returncode == 0, started.stderr
        engines = json.loads((directory / "cluster.json").read_text())["engines"]
        pids = [supervisor_of(engine["store_dir"]) for engine in engines]
        shown = cluster("status", "--dir", str(directory), "--json")
        assert shown.returncode == 0, shown.stderr
        rows = json.loads(shown.stdout)["engines"]
        assert [(r["name"], r["endpoint"], r["state"], r["role"], r["pid"]) for r in rows] == [
            ("master", f"tcp://127.0.0.1:{port}", "RUNNING", "master", pids[0]),
            ("replica-1", f"tcp://127.0.0.1:{port + 10}", "RUNNING", "replica", pids[1])]
        text = cluster("status", "--dir", str(directory))
        assert [line.split()[:6] for line in text.stdout.splitlines()] == [
            [r["name"], r["endpoint"], r["state"], r["role"], f"pid={r['pid']}", f"log_end={r['log_end']}"]
            for r in rows], text.stdout
        stopped = subprocess.run([sys.executable, "-m", "supervisor", "stop", "--store-dir", engines[1]["store_dir"]],
                                 capture_output=True, text=True, timeout=90, check=False)
        assert stopped.returncode == 0, stopped.stderr
        gone = json.loads(cluster("status", "--dir", str(directory), "--json").stdout)["engines"][1]
        assert (gone["name"], gone["state"]) == ("replica-1", "STOPPED") and "no engine is running" in gone["reason"]
    finally:
        cluster("stop", "--dir", str(directory))


@pytest.mark.timeout(240)  # three etcd members, two engines, one of them started twice: 40 s here
def test_one_engine_stopped_and_started_by_name_while_status_shows_roles_lag_and_etcd_members(tmp_path: Path) -> None:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    port, etcd_port = free_port(), free_port()
    directory = tmp_path / "cluster"
    started = cluster("start", "--insecure", "--dir", str(directory), "--etcd", "--replicas", "1", "--port", str(port),
                      "--etcd-port", str(etcd_port))
    try:
        assert started.returncode == 0, started.stderr
        again = cluster("start", "--insecure", "--dir", str(directory), "--etcd", "--port", str(port),
                        "--etcd-port", str(etcd_port))
        assert again.returncode == 4, (again.returncode, again.stderr)  # as `start` on a store in use
        assert f"the cluster in {directory} is running" in again.stderr and "cluster stop --dir" in again.stderr
        with StoreClient(f"tcp://127.0.0.1:{port}") as master:
            master.create_topic("demo", queue_count=1)
            master.send("demo", [{"body": b"x" * 1000}])
        shown = status_json(directory)
        assert [(r["name"], r["role"], r["epoch"], r["master"]) for r in shown["engines"]] == [
            ("broker-0", "master", 1, "broker-0"), ("broker-1", "replica", 1, "broker-0")]
        assert {r["state"] for r in shown["engines"]} <= {"RUNNING", "DEGRADED"}  # DEGRADED: a slow etcd answer
        assert all(isinstance(r["behind_bytes"], int) and r["behind_bytes"] >= 0 for r in shown["engines"])
        assert shown["engines"][0]["behind_bytes"] == 0
        etcd = shown["etcd"]
        assert [(r["name"], r["endpoint"], r["up"], r["healthy"]) for r in etcd] == [
            (f"etcd-{k}", f"http://127.0.0.1:{etcd_port + 2 * k}", True, True) for k in range(3)]
        assert sum(bool(r["leader"]) for r in etcd) == 1

        unknown = cluster("stop-engine", "broker-9", "--dir", str(directory))
        assert unknown.returncode == 2 and "broker-0, broker-1" in unknown.stderr, unknown.stderr
        stopped = cluster("stop-engine", "broker-1", "--dir", str(directory))
        assert stopped.returncode == 0 and stopped.stdout.split()[:2] == ["broker-1", "stopped"], stopped
        again = cluster("stop-engine", "broker-1", "--dir", str(directory))
        assert again.returncode == 3 and "not running" in again.stdout, again  # as `stop` of no engine
        assert status_json(directory)["engines"][1]["state"] == "STOPPED"
        restarted = cluster("start-engine", "broker-1", "--dir", str(directory))
        assert restarted.returncode == 0, restarted.stderr
        assert restarted.stdout.split()[:2] == ["broker-1", f"tcp://127.0.0.1:{port + 10}"]
        again = cluster("start-engine", "broker-1", "--dir", str(directory))
        assert again.returncode == 4 and "broker-1 is already running" in again.stderr, again
        back = status_json(directory)["engines"][1]
        assert (back["role"], back["master"], back["pid"]) == ("replica", "broker-0", supervisor_of(back["store_dir"]))

        killed = json.loads((directory / "cluster.json").read_text())["etcd_pids"][1]
        psutil.Process(killed).kill()
        psutil.Process(killed).wait(10)
        deadline = time.monotonic() + 30  # the killed member may have led: the other two elect one first
        while True:
            etcd = status_json(directory)["etcd"]
            assert [(r["up"], r["pid"]) for r in etcd][1] == (False, killed)
            if [r["up"] and r["healthy"] for r in etcd] == [True, False, True]:  # two of three: a quorum
                break
            assert time.monotonic() < deadline, etcd
        text = cluster("status", "--dir", str(directory)).stdout.splitlines()
        assert text[3].split()[:3] == ["etcd-1", f"http://127.0.0.1:{etcd_port + 2}", "down"], text
    finally:
        stopped = cluster("stop", "--dir", str(directory))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert stopped.stdout.splitlines()[-1].startswith("etcd       stopped")


def status_json(directory: Path) -> dict[str, list[dict[str, object]]]:
    shown = cluster("status", "--dir", str(directory), "--json")
    assert shown.returncode == 0, shown.stderr
    answer: dict[str, list[dict[str, object]]] = json.loads(shown.stdout)
    return answer


@pytest.mark.timeout(30)
def test_a_stopped_cluster_is_not_started_on_other_etcd_members_than_its_own(tmp_path: Path) -> None:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    directory = tmp_path / "cluster"
    directory.mkdir()
    recorded = {"etcd_endpoints": "http://127.0.0.1:2379", "etcd_pids": [], "engines": []}  # one member, stopped
    (directory / "cluster.json").write_text(json.dumps(recorded))
    refused = cluster("start", "--insecure", "--dir", str(directory), "--etcd", "--etcd-members", "3",
                      "--etcd-port", "2379")
    assert refused.returncode == 2, (refused.returncode, refused.stderr)
    assert "was started on etcd members http://127.0.0.1:2379, not http://127.0.0.1:2379,http://127.0.0.1:2381," \
           in refused.stderr, refused.stderr
    assert sorted(path.name for path in directory.iterdir()) == ["cluster.json"]  # nothing written, nothing started
