"""Pop consumers on a live engine: pop, ack, change of invisible time, redelivery, dead letters."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from engine.client import EngineError
from engine.config import StoreConfig
from supervisor.launcher import EngineProcess
from tests.helpers import parked_requests, wait_dispatched

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """One engine for the module (an engine's start and stop cost more than most tests here): each
    test creates topics of its own, and what it asserts of a group is of that group on its topics."""
    with EngineProcess(tmp_path_factory.mktemp("pop-ack") / "store", config=StoreConfig.test_min()) as process:
        yield process


def send_numbered(client, topic: str, count: int, *, batch: int = 200) -> None:
    for start in range(0, count, batch):
        client.send(topic, [{"body": b"%d" % n} for n in range(start, min(count, start + batch))])


def test_a_popped_message_is_invisible_until_acked_or_its_time_passes(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("work", queue_count=1)
        send_numbered(client, "work", 3)
        wait_dispatched(client)  # a send is answered once in the log; a pop reads the queue
        first = client.pop("g", "work", invisible_ms=60_000)
        assert [m["body"] for m in first] == [b"0", b"1", b"2"]
        assert {m["attempt"] for m in first} == {1}
        assert client.pop("g", "work") == [], "invisible to the group's other pops"
        assert [m["body"] for m in client.pop("other", "work")] == [b"0", b"1", b"2"], "groups are independent"
        assert client.ack("g", first[:2]) == []
        handle = client.change_invisible_duration("g", first[2], 0)  # a nack
        assert handle != first[2]["receipt_handle"]
        again = wait_for_pop(client, "g", "work")
        assert [(m["body"], m["attempt"]) for m in again] == [(b"2", 2)]
        assert client.ack("g", first[2:])[0]["error"]["name"] == "INVALID_RECEIPT_HANDLE", "the old handle is stale"
        assert client.ack("g", again) == []
        assert client.ack("g", again) == [], "acking twice with the same handle is fine"
        stats = client.pop_stats("g", "work", 0)
        assert (stats["ack_floor"], stats["in_flight"], stats["redelivered"]) == (3, 0, 1)


def wait_for_pop(client, group: str, topic: str, *, deadline_s: float = 20, **kwargs) -> list[dict]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        messages = client.pop(group, topic, max_wait_ms=1_000, **kwargs)
        if messages:
            return messages
    raise AssertionError("no message came back")


def test_an_expired_message_comes_back_after_its_invisible_time_only(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("expiry", queue_count=2)
        send_numbered(client, "expiry", 4)
        wait_dispatched(client)
        taken = []
        first_asked = time.monotonic()  # every delivery was made after this
        while len(taken) < 4:
            taken += client.pop("g", "expiry", invisible_ms=1_500)
        back = client.pop("g", "expiry", invisible_ms=60_000)
        assert back == [], "nothing comes back before its invisible time"
        while len(back) < 4:
            back += client.pop("g", "expiry", max_wait_ms=3_000, invisible_ms=60_000)
        assert time.monotonic() - first_asked >= 1.5, "no redelivery before the invisible time"
        assert sorted(m["body"] for m in back) == sorted(m["body"] for m in taken)
        assert {m["attempt"] for m in back} == {2}


def test_a_long_poll_pop_is_answered_when_a_message_arrives(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("lp", queue_count=4)
        got: list[list[dict]] = []

        def consume() -> None:
            with engine.client() as consumer:
                got.append(consumer.pop("g", "lp", queue_id=3, max_wait_ms=20_000))

        waiter = threading.Thread(target=consume)
        started = time.monotonic()
        waiter.start()
        deadline = time.monotonic() + 10
        while parked_requests(engine) < 1:  # the pop is parked at its owner
            assert time.monotonic() < deadline
        client.send("lp", [{"body": b"wake"}], queue_id=3)
        waiter.join(20)
        assert got and [m["body"] for m in got[0]] == [b"wake"]
        assert time.monotonic() - started < 15


def test_after_the_attempt_limit_a_message_goes_to_the_dead_letter_queue(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("poison", queue_count=1)
        [sent] = client.send("poison", [{"body": b"bad", "tags": "t", "keys": ["k1"],
                                         "properties": {"a": "b"}}])
        attempts = []
        deadline = time.monotonic() + 60
        while len(attempts) < 16:
            assert time.monotonic() < deadline
            for message in client.pop("g", "poison", max_wait_ms=500):
                attempts.append(message["attempt"])
                client.nack("g", message)
        assert attempts == list(range(1, 17))
        dead = []
        while not dead:
            assert time.monotonic() < deadline
            dead = client.pull("%DLQ%g", 0, 0, max_wait_ms=1_000)["messages"]
        [letter] = dead
        assert letter["body"] == b"bad" and letter["tags"] == "t" and letter["keys"] == ["k1"]
        assert letter["properties"]["DLQ_ORIGIN_TOPIC"] == "poison"
        assert letter["properties"]["DLQ_ORIGIN_MESSAGE_ID"] == sent["msg_id"]
        assert letter["properties"]["DLQ_ORIGIN_QUEUE_OFFSET"] == "0"
        assert letter["properties"]["a"] == "b"
        assert client.pop("g", "poison", max_wait_ms=300) == []
        while client.pop_stats("g", "poison", 0)["dead_lettered"] != 1:
            assert time.monotonic() < deadline
        assert client.pop_stats("g", "poison", 0)["ack_floor"] == 1


def test_a_group_either_pops_or_commits_offsets(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("modes", queue_count=1)
        client.commit_offset("offsets", "modes", 0, 0)
        with pytest.raises(EngineError) as refused:
            client.pop("offsets", "modes")
        assert refused.value.name == "GROUP_MODE_CONFLICT"
        client.pop("pops", "modes")
        with pytest.raises(EngineError) as refused:
            client.commit_offset("pops", "modes", 0, 0)
        assert refused.value.name == "GROUP_MODE_CONFLICT"


def test_bad_pop_requests_get_clear_errors(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("bad", queue_count=1)
        cases = [
            ({"op": "pop", "topic": "bad"}, "INVALID_FIELD"),
            ({"op": "pop", "group": "g\n", "topic": "bad"}, "INVALID_FIELD"),
            ({"op": "pop", "group": "g", "topic": "nope"}, "TOPIC_NOT_FOUND"),
            ({"op": "pop", "group": "g", "topic": "bad", "queue_id": 9}, "QUEUE_NOT_FOUND"),
            ({"op": "ack", "group": "g", "topic": "bad", "queue_id": 0, "receipt_handles": []}, "INVALID_FIELD"),
            ({"op": "change_invisible", "group": "g", "topic": "bad", "queue_id": 0, "receipt_handle": "0:0:1:x",
              "invisible_ms": 10}, "INVALID_RECEIPT_HANDLE"),
            ({"op": "pop", "group": "g", "topic": "bad", "invisible_ms": -1}, "INVALID_FIELD"),
        ]
        for fields, name in cases:
            op = fields.pop("op")
            with pytest.raises(EngineError) as refused:
                client.request(op, **fields)
            assert refused.value.name == name, (op, fields)
        failed = client.request("ack", group="g", topic="bad", queue_id=0, receipt_handles=["junk"])["failed"]
        assert failed[0]["error"]["name"] == "INVALID_RECEIPT_HANDLE"
        assert client.ping()


def test_three_pop_consumers_ack_every_message_exactly_once(engine: EngineProcess) -> None:
    total = 20_000
    with engine.client() as client:
        client.create_topic("pool", queue_count=4)
        send_numbered(client, "pool", total, batch=500)
    acked: Counter[bytes] = Counter()
    deliveries: dict[bytes, list[tuple[float, float, int]]] = {}  # (pop asked, reply received, attempt)
    lock = threading.Lock()
    done = threading.Event()
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with engine.client() as consumer:
                while not done.is_set():
                    asked = time.monotonic()
                    messages = consumer.pop("pool-g", "pool", max_messages=32, invisible_ms=1_000, max_wait_ms=200)
                    now = time.monotonic()
                    keep = []
                    with lock:
                        for message in messages:
                            deliveries.setdefault(message["body"], []).append((asked, now, message["attempt"]))
                            if rng.random() < 0.9:
                                keep.append(message)
                    failed = consumer.ack("pool-g", keep)
                    failed_handles = {f["receipt_handle"] for f in failed}
                    with lock:
                        for message in keep:
                            if message["receipt_handle"] not in failed_handles:
                                acked[message["body"]] += 1
                        if len(acked) == total:
                            done.set()
        except BaseException as exc:
            errors.append(exc)
            done.set()

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
    done.wait(150)
    done.set()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert len(acked) == total, f"{total - len(acked)} messages never acked"
    assert set(acked.values()) == {1}, "a message was acked twice"
    for body, seen in deliveries.items():
        attempts = [attempt for _asked, _received, attempt in seen]
        assert attempts == list(range(1, len(attempts) + 1)), (body, attempts)
        for (earlier_asked, _, _), (_, later_received, _) in itertools.pairwise(seen):
            # The earlier delivery was made after its pop was asked; the later one arrived
            # no sooner than the earlier's invisible time after that.
            assert later_received - earlier_asked >= 0.99, f"{body!r} came back before its invisible time"
    with engine.client() as client:
        for queue_id in range(4):
            stats = client.pop_stats("pool-g", "pool", queue_id)
            assert stats["in_flight"] == 0 and stats["ack_floor"] == stats["max_offset"], stats


def test_a_tag_subscription_pops_only_its_tags_and_pull_consumers_are_not_affected(engine: EngineProcess) -> None:
    with engine.client() as client:
        client.create_topic("tagged", queue_count=1)
        client.send("tagged", [{"body": b"%d" % n, "tags": "A" if n % 3 == 0 else "B"} for n in range(30)])
        wait_dispatched(client)
        wanted = []
        while batch := client.pop("only-a", "tagged", subscription="A", max_messages=4, max_wait_ms=200):
            assert {m["tags"] for m in batch} == {"A"}
            wanted += batch
            assert client.ack("only-a", batch) == []
        assert sorted(int(m["body"]) for m in wanted) == list(range(0, 30, 3))
        stats = client.pop_stats("only-a", "tagged", 0)
        assert stats["ack_floor"] == 30 and stats["in_flight"] == 0, "the other tags are skipped, not pending"
        pulled = client.pull("tagged", 0, 0, max_messages=100)["messages"]
        assert len(pulled) == 30, "an offset consumer still reads everything"
        client.commit_offset("pullers", "tagged", 0, 30)
        assert client.fetch_offset("pullers", "tagged", 0) == 30


def test_a_fifo_group_gets_a_queues_next_message_only_once_the_earlier_ones_are_done(store_dir) -> None:
    from engine.config import StoreConfig
    from engine.names import dead_letter_topic

    config = StoreConfig.test_min().replace(fifo_groups=("ordered",))
    with EngineProcess(store_dir, config=config) as engine, engine.client() as client, \
            engine.client(timeout_ms=20_000) as waiter:
        client.create_topic("fifo", queue_count=1)
        send_numbered(client, "fifo", 4)
        wait_dispatched(client)
        first = client.pop("ordered", "fifo", max_messages=2)
        assert [m["body"] for m in first] == [b"0", b"1"]
        assert client.pop("ordered", "fifo") == [], "locked while a delivery is invisible"
        assert [m["body"] for m in client.pop("plain", "fifo", max_messages=2)] == [b"0", b"1"], "other groups: not"
        parked: dict[str, list] = {}
        thread = threading.Thread(target=lambda: parked.setdefault("got", waiter.pop(
            "ordered", "fifo", max_messages=4, max_wait_ms=15_000)))
        thread.start()
        deadline = time.monotonic() + 10
        while parked_requests(engine) < 1 and time.monotonic() < deadline:
            thread.join(0.02)
        assert client.ack("ordered", first[:1]) == []
        assert client.nack("ordered", first[1])  # due again: it goes first, before 2 and 3
        thread.join(15)
        assert [(m["body"], m["attempt"]) for m in parked["got"]] == [(b"1", 2)]
        assert client.dead_letter("ordered", parked["got"]) == []  # given up on: to the DLQ, and unlocked
        rest = wait_for_pop(client, "ordered", "fifo", max_messages=4)
        assert [m["body"] for m in rest] == [b"2", b"3"]
        dead = client.pull(dead_letter_topic("ordered"), 0, 0, max_wait_ms=5_000)["messages"]
        assert [m["body"] for m in dead] == [b"1"] and dead[0]["properties"]["DLQ_DELIVERY_ATTEMPTS"] == "2"


@pytest.mark.timeout(60)
def test_a_group_name_of_255_characters_pops_dead_letters_and_commits_and_256_is_refused(engine: EngineProcess) -> None:
    from engine.names import GROUP_NAME_CHARS_MAX, TOPIC_NAME_CHARS_MAX, dead_letter_topic, is_topic_name

    assert GROUP_NAME_CHARS_MAX == 255  # RocketMQ's limit for a group
    popper, committer, too_long = "p" * 255, "c" * 255, "x" * 256
    with engine.client() as client:
        client.create_topic("long-groups", queue_count=1)
        client.send("long-groups", [{"body": b"a"}, {"body": b"b"}])
        wait_dispatched(client)
        first, second = wait_for_pop(client, popper, "long-groups")
        assert client.ack(popper, [first]) == []
        assert client.dead_letter(popper, [second]) == []
        # its dead-letter topic is a topic name: %DLQ% and a shortened group, within the topic limit
        dead_letters = dead_letter_topic(popper)
        assert len(dead_letters) <= TOPIC_NAME_CHARS_MAX and is_topic_name(dead_letters)
        assert dead_letters != dead_letter_topic("p" * 254)
        deadline = time.monotonic() + 20
        while not (dead := client.pull(dead_letters, 0, 0, max_wait_ms=1_000)["messages"]):
            assert time.monotonic() < deadline
        assert [m["body"] for m in dead] == [b"b"]
        assert client.pop_stats(popper, "long-groups", 0)["ack_floor"] == 2
        client.commit_offset(committer, "long-groups", 0, 1)
        assert client.fetch_offset(committer, "long-groups", 0) == 1
        for refused_call in (lambda: client.pop(too_long, "long-groups"),
                             lambda: client.commit_offset(too_long, "long-groups", 0, 1)):
            with pytest.raises(EngineError) as refused:
                refused_call()
            assert refused.value.name == "INVALID_FIELD" and "255" in refused.value.message
