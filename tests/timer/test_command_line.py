"""Delayed messages and transactions from the command line, as the README shows them."""

from __future__ import annotations

import json
import time

import pytest

from supervisor.launcher import EngineProcess
from tests.integration.test_command_line import run
from tests.timer.conftest import TOPIC

pytestmark = pytest.mark.timeout(120)


def test_produce_delayed_and_transactional_then_decide_and_see_the_stats(timed_engine: EngineProcess) -> None:
    ep = ["--endpoint", timed_engine.endpoint]
    sent_ms = time.time_ns() // 1_000_000
    run("-m", "engine", "produce", *ep, "--topic", TOPIC, "--body", "in a second", "--queue-id", "0",
        "--delay-ms", "1000")
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sent_ms / 1000 + 4)) + "Z"
    run("-m", "engine", "produce", *ep, "--topic", TOPIC, "--body", "at a time", "--queue-id", "0",
        "--deliver-at", at)
    half = json.loads(run("-m", "engine", "produce", *ep, "--topic", TOPIC, "--body", "paid", "--queue-id", "1",
                          "--transaction", "--json").stdout)["results"][0]["msg_id"]
    stats = json.loads(run("-m", "engine", "stats", *ep, "--json").stdout)
    assert "timers_pending" in stats and "halves_pending" in stats
    assert json.loads(run("-m", "engine", "consume", *ep, "--topic", TOPIC, "--queue-id", "1",
                          "--json").stdout) == []
    checks = json.loads(run("-m", "engine", "transaction", *ep, "--checks", "--wait-ms", "5000",
                            "--json").stdout)
    assert [c["msg_id"] for c in checks] == [half]
    decided = json.loads(run("-m", "engine", "transaction", *ep, "--commit", half, "--json").stdout)
    assert decided == {"msg_id": half, "decision": "commit"}
    refused = run("-m", "engine", "transaction", *ep, "--rollback", half, check=False)
    assert refused.returncode == 1 and "TRANSACTION_ENDED" in refused.stderr
    consumed = json.loads(run("-m", "engine", "consume", *ep, "--topic", TOPIC, "--queue-id", "1",
                              "--json").stdout)
    assert [m["body"] for m in consumed] == ["paid"]
    delayed = json.loads(run("-m", "engine", "consume", *ep, "--topic", TOPIC, "--queue-id", "0", "--count", "2",
                             "--wait-ms", "5000", "--json").stdout)
    while len(delayed) < 2:
        delayed += json.loads(run("-m", "engine", "consume", *ep, "--topic", TOPIC, "--queue-id", "0", "--offset",
                                  str(len(delayed)), "--wait-ms", "5000", "--json").stdout)
    assert [m["body"] for m in delayed] == ["in a second", "at a time"]
    assert delayed[0]["store_timestamp"] >= sent_ms + 1000
    bad = run("-m", "engine", "produce", *ep, "--topic", TOPIC, "--deliver-at", "tomorrow", check=False)
    assert bad.returncode == 2 and "ISO 8601" in bad.stderr
