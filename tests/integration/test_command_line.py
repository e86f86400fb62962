"""The command lines as a user runs them: python -m supervisor and python -m engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from engine.config import StoreConfig
from supervisor.launcher import EngineProcess, free_port, write_config

pytestmark = pytest.mark.timeout(180)


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def test_engine_commands_produce_consume_query_and_inspect(engine: EngineProcess, store_dir: Path) -> None:
    ep = ["--endpoint", engine.endpoint]
    out = run("-m", "engine", "produce", *ep, "--topic", "cli", "--count", "50", "--batch-size", "10",
              "--keys", "--tags", "TagA", "--json")
    summary = json.loads(out.stdout)
    assert summary["sent"] == 50 and summary["messages_per_second"] > 0
    run("-m", "engine", "produce", "--store-dir", str(store_dir), "--topic", "cli", "--body", "hello there",
        "--queue-id", "2")
    topics = json.loads(run("-m", "engine", "topics", *ep, "--json").stdout)
    assert topics == [{"topic": "cli", "queue_count": 4}]
    from tests.helpers import wait_dispatched

    with engine.client() as client:
        wait_dispatched(client)
    consumed = json.loads(run("-m", "engine", "consume", *ep, "--topic", "cli", "--count", "1000", "--json").stdout)
    assert len(consumed) == 51
    assert "hello there" in {m["body"] for m in consumed}
    found = json.loads(run("-m", "engine", "query", *ep, "--topic", "cli", "--key", "key-42", "--json").stdout)
    assert [m["keys"] for m in found] == [["key-42"]]
    by_id = json.loads(run("-m", "engine", "query", *ep, "--id", found[0]["msg_id"], "--json").stdout)
    assert by_id[0]["queue_offset"] == found[0]["queue_offset"]
    first = json.loads(run("-m", "engine", "consume", *ep, "--topic", "cli", "--group", "g1", "--count", "1000",
                           "--subscription", "TagA", "--json").stdout)
    assert len(first) == 50  # the one message without a tag is not TagA
    again = json.loads(run("-m", "engine", "consume", *ep, "--topic", "cli", "--group", "g1", "--json").stdout)
    assert again == [], "the group resumes where it committed"
    stats = json.loads(run("-m", "engine", "stats", *ep, "--topic", "cli", "--group", "g1", "--json").stdout)
    assert sum(r["message_count"] for r in stats) == 51 and all(r["lag"] == 0 for r in stats)
    text = run("-m", "engine", "consume", *ep, "--topic", "cli", "--queue-id", "2", "--count", "3").stdout
    assert "cli/2@0" in text
    [hello] = [m for m in consumed if m["body"] == "hello there"]
    since = json.loads(run("-m", "engine", "consume", *ep, "--topic", "cli", "--since-ms",
                           str(hello["store_timestamp"]), "--json").stdout)
    assert since and all(m["store_timestamp"] >= hello["store_timestamp"] for m in since)
    assert "hello there" in {m["body"] for m in since}
    run("-m", "engine", "topics", *ep, "--create", "scratch", "--queues", "1")
    deleted = json.loads(run("-m", "engine", "topics", *ep, "--delete", "scratch", "--json").stdout)
    assert deleted["topic"] == "scratch"
    assert [t["topic"] for t in json.loads(run("-m", "engine", "topics", *ep, "--json").stdout)] == ["cli"]
    bad = run("-m", "engine", "produce", *ep, "--topic", "bad/name", check=False)
    assert bad.returncode == 1 and "INVALID_TOPIC" in bad.stderr
    engine.stop()
    report = json.loads(run("-m", "engine", "inspect", "--store-dir", str(store_dir), "--json").stdout)
    assert report["segments"] and report["records"][0]["topic"] == "cli"
    assert sum(q["max_offset"] for q in report["queues"] if q["topic"] == "cli") == 51
    assert report["checkpoint"]["dispatched_offset"] > 0
    assert report["abort_marker"] is False


def test_a_worker_pool_pops_and_acks_from_the_command_line(engine: EngineProcess) -> None:
    ep = ["--endpoint", engine.endpoint]
    run("-m", "engine", "produce", *ep, "--topic", "jobs", "--count", "40", "--batch-size", "40")
    from tests.helpers import wait_dispatched

    with engine.client() as client:
        wait_dispatched(client)
    engine_cmd = ("-m", "engine", "consume", *ep, "--topic", "jobs", "--group", "workers", "--pop", "--json")
    taken = json.loads(run(*engine_cmd, "--count", "10", "--invisible-ms", "60000").stdout)
    assert len(taken) == 10 and {m["attempt"] for m in taken} == {1}
    rest = json.loads(run(*engine_cmd, "--ack", "--count", "1000", "--wait-ms", "300").stdout)
    assert len(rest) == 30, "the ten taken without an ack stay invisible"
    stats = json.loads(run("-m", "engine", "stats", *ep, "--topic", "jobs", "--group", "workers", "--json").stdout)
    assert sum(r["in_flight"] for r in stats) == 10
    assert sum(r["ack_floor"] for r in stats) < 40 and all(r["dead_lettered"] == 0 for r in stats)
    text = run("-m", "engine", "stats", *ep, "--topic", "jobs", "--group", "workers").stdout
    assert "in flight" in text and "dead-lettered 0" in text
    usage = run("-m", "engine", "consume", *ep, "--topic", "jobs", "--pop", check=False)
    assert usage.returncode == 2 and "--group" in usage.stderr


def test_supervisor_detach_status_and_stop(tmp_path: Path) -> None:
    store = tmp_path / "store"
    port = free_port()
    config = write_config(tmp_path / "engine.toml", StoreConfig.test_min())
    started = run("-m", "supervisor", "start", "--detach", "--store-dir", str(store), "--config", str(config),
                  "--endpoint", f"tcp://127.0.0.1:{port}")
    assert started.stdout.startswith(f"ready tcp://127.0.0.1:{port}")
    try:
        status = json.loads(run("-m", "supervisor", "status", "--store-dir", str(store), "--json").stdout)
        assert status["state"] == "RUNNING"
        names = {a["name"] for a in status["actors"]}
        assert names == {"writer", "flusher", "owner-0", "owner-1", "index", "reput", "timer", "transactions", "front"}
        assert all(psutil.pid_exists(a["pid"]) for a in status["actors"])
        again = run("-m", "supervisor", "start", "--store-dir", str(store), "--config", str(config),
                    "--endpoint", f"tcp://127.0.0.1:{free_port()}", check=False)
        assert again.returncode == 4 and "another engine (pid " in again.stderr
    finally:
        stopped = run("-m", "supervisor", "stop", "--store-dir", str(store))
    assert stopped.stdout.strip() == "stopped"
    assert not any(psutil.pid_exists(a["pid"]) for a in status["actors"])
    gone = run("-m", "supervisor", "status", "--store-dir", str(store), check=False)
    assert gone.returncode == 3


def test_ctrl_c_stops_cleanly(store_dir: Path) -> None:
    engine = EngineProcess(store_dir)
    engine.start()
    with engine.client() as client:
        client.send("t", [{"body": b"x"}])
    assert engine.stop() == 0  # SIGINT, as Ctrl-C sends
    assert b"stopped\n" in engine.output and b"not cleanly" not in engine.output, engine.output.decode()
    assert not (store_dir / "abort").exists()
