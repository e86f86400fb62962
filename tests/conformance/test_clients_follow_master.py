"""The C and Node clients follow a master: pointed at a replica, their writes reach its master.

A replica refuses every write with NOT_MASTER naming its master's endpoint
(docs/protocol.md 7.3); each client then moves to that endpoint, sends the same
request there once more, and stays there. Both clients also ask engines for
their ``route`` (protocol 4.14) and must answer what the Python client answers.
The clients are run through their conformance drivers (see test_clients.py),
which also take the ops ``route`` and ``endpoint`` (where the client is now).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.client import StoreClient
from engine.config import StoreConfig
from harness.replication import replicated_pair
from supervisor.launcher import EngineProcess, free_port
from tests.conformance.test_clients import b64, drive, require_drivers
from tests.helpers import wait_dispatched

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]  # a master and a replica per test: the long run

FOLLOWERS = ("c", "node")  # the Python client's following is tested with rmqpy (tests/replication)
TOPIC = "follow-master"  # one queue per client
NOT_MASTER = 27


def master_endpoint_known(replica: EngineProcess, *, timeout_s: float = 30.0) -> str:
    """The master's endpoint, once the replica has heard it from its master (its NOT_MASTER names it then)."""
    deadline = time.monotonic() + timeout_s
    with StoreClient(replica.endpoint) as client:
        while time.monotonic() < deadline:
            master = client.route()["master_endpoint"]
            if master:
                return str(master)
            time.sleep(0.1)
    raise TimeoutError(f"the replica did not learn its master's endpoint within {timeout_s} s")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineProcess, EngineProcess]]:
    require_drivers()
    config = StoreConfig.test_min().replace(replication_report_interval_ms=200)
    with replicated_pair(tmp_path_factory.mktemp("follow-master"), config) as (master, replica):
        with master.client() as client:
            client.create_topic(TOPIC, queue_count=len(FOLLOWERS))
        assert master_endpoint_known(replica) == master.endpoint
        yield master, replica


def sends_of(client: str, queue_id: int) -> list[dict[str, Any]]:
    """One single send and one batch, both to the client's own queue."""
    def message(n: int) -> dict[str, Any]:
        return {"body_b64": b64(f"{client} via the replica {n}".encode()), "keys": [f"{client}-{n}"]}

    return [{"op": "send", "topic": TOPIC, "queue_id": queue_id, "messages": [message(0)]},
            {"op": "send", "topic": TOPIC, "queue_id": queue_id, "messages": [message(1), message(2)]}]


def bodies(messages: list[dict[str, Any]]) -> list[bytes]:
    return [m["body"] for m in messages]


def test_writes_sent_to_a_replica_are_stored_on_its_master_through_every_client(pair) -> None:
    """Each client starts on the replica: its first send is refused there and sent again to the
    master, where it stays: the batch and a commit_offset (another write) go there at once."""
    master, replica = pair
    for queue_id, client in enumerate(FOLLOWERS):
        before, single, batch, after, committed = drive(client, replica.endpoint, [
            {"op": "endpoint"}, *sends_of(client, queue_id), {"op": "endpoint"},
            {"op": "commit_offset", "group": f"readers-{client}", "topic": TOPIC, "queue_id": queue_id, "offset": 2}])
        assert (before["endpoint"], after["endpoint"]) == (replica.endpoint, master.endpoint), client
        assert single["ok"] and batch["ok"] and committed == {"ok": True}, (client, single, batch, committed)
        results = single["results"] + batch["results"]
        assert [(r["status"], r["queue_id"], r["queue_offset"]) for r in results] == \
            [("PUT_OK", queue_id, 0), ("PUT_OK", queue_id, 1), ("PUT_OK", queue_id, 2)], client
        with StoreClient(master.endpoint) as on_master:
            wait_dispatched(on_master)
            stored = on_master.pull(TOPIC, queue_id, 0)["messages"]
            assert bodies(stored) == [f"{client} via the replica {n}".encode() for n in range(3)], client
            assert [m["msg_id"] for m in stored] == [r["msg_id"] for r in results], client
            assert on_master.fetch_offset(f"readers-{client}", TOPIC, queue_id) == 2, client


def test_every_client_reads_the_route_the_python_client_reads(pair) -> None:
    """route is answered by both engines and moves no client: the replica names its master."""
    master, replica = pair
    expected = {}
    for engine in (master, replica):
        with StoreClient(engine.endpoint) as client:
            expected[engine.endpoint] = {k: v for k, v in client.route().items() if k not in ("v", "id")}
    assert expected[replica.endpoint]["role"] == "replica"
    assert expected[replica.endpoint]["master_endpoint"] == master.endpoint
    assert expected[master.endpoint]["role"] == "master"
    for client in FOLLOWERS:
        for engine in (master, replica):
            route, where = drive(client, engine.endpoint, [{"op": "route"}, {"op": "endpoint"}])
            # reply_endpoints and send_endpoint are for a client that takes answers past the front and
            # sends to the writer (docs/protocol.md 1.1), which the C, Node and Go clients do not: one
            # passes them on, another leaves them out
            past_the_front = ("reply_endpoints", "send_endpoint")
            for field in past_the_front:
                route.pop(field, None)
            assert route == {k: v for k, v in expected[engine.endpoint].items() if k not in past_the_front}, \
                (client, engine.endpoint, route)
            assert where["endpoint"] == engine.endpoint, client


@pytest.fixture
def lone_replica(tmp_path: Path) -> Iterator[EngineProcess]:
    """A replica whose master never answers: it knows no master to name."""
    require_drivers()
    config = StoreConfig.test_min().replace(replica_of=f"tcp://127.0.0.1:{free_port()}")
    process = EngineProcess(tmp_path / "replica", config=config)
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_a_not_master_that_names_no_master_is_returned_and_the_client_stays(lone_replica: EngineProcess) -> None:
    for client in FOLLOWERS:
        refused, route, where = drive(client, lone_replica.endpoint, [
            {"op": "send", "topic": TOPIC, "messages": [{"body_b64": b64(b"x")}]},
            {"op": "route"}, {"op": "endpoint"}])
        assert (refused["ok"], refused["code"], refused["name"]) == (False, NOT_MASTER, "NOT_MASTER"), (client, refused)
        assert (route["role"], route["master_endpoint"]) == ("replica", ""), (client, route)
        assert where["endpoint"] == lone_replica.endpoint, client
