"""``query_by_keys``: many keys in one round trip, each key's answer what ``query_by_key`` gives; a
reply past its size cap answers the first keys and the client asks again for the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.client import EngineError
from engine.config import KiB, StoreConfig
from harness.workload import wait_dispatched
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(60)


def test_many_keys_answer_as_one_key_each_does(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("orders", queue_count=2)
        client.send("orders", [{"body": b"o%d" % i, "keys": [f"order-{i}", "all"]} for i in range(30)])
        wait_dispatched(client)
        keys = ["order-3", "nothing", "order-29", "all", "order-3"]
        found = client.query_by_keys("orders", keys, max_results=8)
        assert found == [client.query_by_key("orders", key, max_results=8) for key in keys]
        assert [len(messages) for messages in found] == [1, 0, 1, 8, 1]
        assert client.query_by_keys("orders", [f"order-{i}" for i in range(30)], keys_per_request=7) == \
            [client.query_by_key("orders", f"order-{i}") for i in range(30)]


def test_bad_requests_are_refused_with_their_codes(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("orders", queue_count=1)
        for fields, code in (({"topic": "orders", "keys": []}, "INVALID_FIELD"),
                             ({"topic": "orders", "keys": [""]}, "INVALID_FIELD"),
                             ({"topic": "orders", "keys": "order-1"}, "INVALID_FIELD"),
                             ({"topic": "nowhere", "keys": ["k"]}, "TOPIC_NOT_FOUND"),
                             ({"topic": "orders", "keys": ["k"] * 1001}, "LIMIT_EXCEEDED")):
            with pytest.raises(EngineError) as info:
                client.request("query_by_keys", **fields)
            assert info.value.name == code, fields
        assert client.ping()


def test_a_reply_past_its_size_cap_answers_the_first_keys_and_the_client_asks_for_the_rest(store_dir: Path) -> None:
    config = StoreConfig.test_min().replace(pull_bytes_max=64 * KiB)
    with EngineProcess(store_dir, config=config) as engine, engine.client() as client:
        client.create_topic("big", queue_count=1)
        client.send("big", [{"body": bytes(20 * KiB), "keys": [f"k{i}"]} for i in range(10)], queue_id=0)
        wait_dispatched(client)
        keys = [f"k{i}" for i in range(10)]
        first = client.request("query_by_keys", topic="big", keys=keys)["found"]
        assert 1 <= len(first) < len(keys)  # about 64 KiB of the 200 KiB asked for
        found = client.query_by_keys("big", keys)
        assert [[m["body"] for m in messages] for messages in found] == [[bytes(20 * KiB)]] * 10


def test_without_the_uniq_key_index_keys_are_found_and_uniq_keys_are_not(store_dir: Path) -> None:
    config = StoreConfig.test_min().replace(index_uniq_key_enabled=False)
    with EngineProcess(store_dir, config=config) as engine, engine.client() as client:
        client.create_topic("orders", queue_count=1)
        [keyed, plain] = client.send("orders", [{"body": b"keyed", "keys": ["order-1"]}, {"body": b"plain"}],
                                     queue_id=0)
        wait_dispatched(client)
        [found] = client.query_by_key("orders", "order-1")
        assert found["body"] == b"keyed"
        uniq_keys = [client.get_by_id(result["msg_id"])["uniq_key"] for result in (keyed, plain)]
        assert all(uniq_keys)
        assert client.query_by_keys("orders", uniq_keys) == [[], []]
        assert client.get_by_id(plain["msg_id"])["body"] == b"plain"  # the offset id needs no index
