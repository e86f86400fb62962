"""``consume --group G`` is a member of the group (engine/cli/group_consume.py): two run at once
share the topic's queues as two ``rmqpy.PullConsumer`` do, and never print the same message."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.client import StoreClient
from supervisor.launcher import EngineProcess
from tests.helpers import parked_requests, wait_dispatched

pytestmark = pytest.mark.timeout(90)

CLI = [sys.executable, "-m", "engine"]


def test_two_group_consumes_at_once_print_every_message_once(engine: EngineProcess, tmp_path: Path) -> None:
    with engine.client() as client:
        client.create_topic("shared", queue_count=4)
        command = [*CLI, "consume", "--endpoint", engine.endpoint, "--topic", "shared", "--group", "g",
                   "--count", "1000", "--json"]
        outputs = [tmp_path / f"consume-{k}.json" for k in range(2)]  # files: a full pipe would hold a consume up
        files = [output.open("w") for output in outputs]
        both = [subprocess.Popen([*command, "--wait-ms", "20000"], stdout=file, stderr=subprocess.PIPE, text=True)
                for file in files]
        try:
            # Both wait for messages: as two members with the queues' pulls parked, or as two readers
            # of every queue (the consume of old, 4 parked pulls each).
            until(lambda: (len(members(client)) == 2 and parked_requests(engine) >= 4) or parked_requests(engine) >= 8)
            for queue_id in range(4):
                client.send("shared", [{"body": f"q{queue_id}-{n}".encode()} for n in range(50)], queue_id=queue_id)
            until(lambda: any(process.poll() is not None for process in both))
            for queue_id in range(4):  # for the one still waiting, which holds every queue once the other left
                client.send("shared", [{"body": f"q{queue_id}-50".encode()}], queue_id=queue_id)
            printed = []
            for process, output in zip(both, outputs, strict=True):
                _out, err = process.communicate(timeout=60)
                assert process.returncode == 0, err
                printed.append({(m["queue_id"], m["queue_offset"]) for m in json.loads(output.read_text())})
        finally:
            for process, file in zip(both, files, strict=True):
                process.kill()
                process.wait()
                file.close()
    rest = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    printed.append({(m["queue_id"], m["queue_offset"]) for m in json.loads(rest.stdout)})
    first, second, third = printed
    assert not first & second, f"{len(first & second)} messages printed by both"
    assert not (first | second) & third, "the group committed what both printed"
    assert sorted(first | second | third) == [(q, n) for q in range(4) for n in range(51)]


def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def members(client: StoreClient) -> list[str]:
    """The group's live members, by a heartbeat that leaves at once (it joins nothing)."""
    reply = client.request("heartbeat", group="g", topic="shared", client_id="observer", leaving=True)
    return [member for member in reply["members"] if member != "observer"]


def test_a_group_consume_with_a_queue_id_reads_that_queue(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("one", queue_count=2)
        client.send("one", [{"body": b"a"}, {"body": b"b"}], queue_id=1)
        wait_dispatched(client)
    command = [*CLI, "consume", "--endpoint", engine.endpoint, "--topic", "one", "--group", "g", "--json"]
    read = subprocess.run([*command, "--queue-id", "1"], capture_output=True, text=True, timeout=60, check=True)
    assert [m["body"] for m in json.loads(read.stdout)] == ["a", "b"]
    usage = subprocess.run([*command, "--offset", "1"], capture_output=True, text=True, timeout=60, check=False)
    assert usage.returncode == 2 and "--queue-id" in usage.stderr
