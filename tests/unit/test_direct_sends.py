"""The writer's decisions on sends made straight to it (``engine/services/writer/direct_sends.py``)
over the routes the front publishes (``engine/store/send_routes.py``), with the real files and the
real shared offsets; and the sync the writer makes in its own loop (``FileSyncer.sync_here``)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.actors.file_syncer import FileSyncer
from engine.config import StoreConfig
from engine.errors import ErrorCode, RequestError
from engine.ipc.protocol import Envelope
from engine.services.writer.direct_sends import DirectSends
from engine.store.send_routes import SEND_ROUTES_FILE, RoutesPublisher, read_routes
from engine.store.shared_offsets import LEASE_DEADLINE, SEND_ROUTES, SharedOffsets
from engine.store.system_topics import TIMER_TOPIC
from engine.store.topics import TopicConfig

pytestmark = pytest.mark.timeout(30)


def table(**queues: int) -> dict[str, TopicConfig]:
    return {name: TopicConfig(name, count, count) for name, count in queues.items()}


def send(topic: str, queue_id: int | None = None, sharding_key: str | None = None) -> Envelope:
    return Envelope(op="send", id=1, topic=topic, queue_id=queue_id, sharding_key=sharding_key)


@pytest.fixture
def slots(tmp_path: Path):
    offsets = SharedOffsets(tmp_path)
    yield offsets
    offsets.close()


def passed_back(sends: DirectSends, envelope: Envelope, now_ms: int = 0) -> str:
    with pytest.raises(RequestError) as refused:
        sends.queue_of(envelope, now_ms)
    assert refused.value.code == ErrorCode.ROUTE_VIA_FRONT
    return refused.value.message


def test_the_writer_takes_the_topics_the_front_published_and_chooses_queues_as_the_front(
        tmp_path: Path, slots: SharedOffsets) -> None:
    publisher, sends = RoutesPublisher(tmp_path, slots), DirectSends(tmp_path, slots, StoreConfig())
    assert "does not know" in passed_back(sends, send("orders"))  # nothing published yet
    version = publisher.publish({**table(orders=3), TIMER_TOPIC: TopicConfig(TIMER_TOPIC, 1, 1)})
    assert slots.get(SEND_ROUTES) == version == read_routes(tmp_path).version == 1
    assert [sends.queue_of(send("orders"), 0) for _ in range(4)] == [0, 1, 2, 0]  # round robin
    assert sends.queue_of(send("orders", queue_id=2), 0) == 2
    assert len({sends.queue_of(send("orders", sharding_key="k-7"), 0) for _ in range(5)}) == 1
    assert "queue 3" in passed_back(sends, send("orders", queue_id=3))
    assert "does not know" in passed_back(sends, send(TIMER_TOPIC))  # the system's own
    assert "only sends" in passed_back(sends, Envelope(op="pull", id=2, topic="orders", queue_id=0))
    publisher.publish(table(orders=8))  # grown: read again at the next send
    assert sends.queue_of(send("orders", queue_id=7), 0) == 7
    assert (sends.taken, sends.passed_on) == (11, 4)


def test_a_deleted_topic_takes_sends_again_only_under_an_entry_published_after_its_deletion(
        tmp_path: Path, slots: SharedOffsets) -> None:
    publisher, sends = RoutesPublisher(tmp_path, slots), DirectSends(tmp_path, slots, StoreConfig())
    publisher.publish(table(orders=2, other=1))
    assert sends.queue_of(send("orders", queue_id=1), 0) == 1
    sends.deleted("orders")  # recorded by the writer: the front has not heard yet
    assert "deleted" in passed_back(sends, send("orders"))
    publisher.publish(table(orders=2, other=1, more=1))  # a save before the front dropped it: the old entry
    assert "deleted" in passed_back(sends, send("orders"))
    publisher.forget("orders")  # the front drops it, and it is created again in the same batch
    publisher.publish(table(orders=2, other=1, more=1))
    assert sends.queue_of(send("orders", queue_id=0), 0) == 0
    assert sends.queue_of(send("other"), 0) == 0  # never deleted: taken throughout


def test_routes_older_than_the_slot_pass_every_send_back(tmp_path: Path, slots: SharedOffsets) -> None:
    publisher, sends = RoutesPublisher(tmp_path, slots), DirectSends(tmp_path, slots, StoreConfig())
    publisher.publish(table(orders=2))
    assert sends.queue_of(send("orders"), 0) == 0
    slots.set(SEND_ROUTES, slots.get(SEND_ROUTES) + 1)  # a version whose file is not there
    assert "older" in passed_back(sends, send("orders"))
    (tmp_path / SEND_ROUTES_FILE).write_bytes(b"\xc1 not msgpack")
    publisher.publish(table(orders=2))  # written whole again, past the slot: taken again
    assert sends.queue_of(send("orders"), 0) == 1


@pytest.mark.parametrize(("setting", "why"), [({"acl_enabled": True}, "checks users"),
                                              ({"replica_of": "tcp://127.0.0.1:1"}, "does not take sends"),
                                              ({"etcd_endpoints": "http://127.0.0.1:1", "replication_endpoint": "tcp://127.0.0.1:2"},
                                               "does not take sends")])
def test_what_only_the_front_decides_is_passed_back(tmp_path: Path, slots: SharedOffsets, setting: dict,
                                                    why: str) -> None:
    RoutesPublisher(tmp_path, slots).publish(table(orders=2))
    sends = DirectSends(tmp_path, slots, StoreConfig().replace(**setting))
    assert why in passed_back(sends, send("orders"), now_ms=1_000)  # an elected master's lease: 0, lapsed
    if "etcd_endpoints" in setting:
        slots.set(LEASE_DEADLINE, 2_000)
        assert sends.queue_of(send("orders"), 1_000) == 0


def test_a_sync_in_the_callers_thread_only_while_the_flush_thread_is_idle(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    path.write_bytes(b"x" * 4096)
    durable: list[tuple[int, str]] = []
    release = threading.Event()
    syncer = FileSyncer("test", lambda offset: durable.append((offset, threading.current_thread().name)))
    try:
        syncer.mark(path)
        assert syncer.sync_here(10)
        assert durable == [(10, threading.current_thread().name)]
        original = syncer.on_durable
        entered = threading.Event()
        syncer.on_durable = lambda offset: (entered.set(), release.wait(10), original(offset))  # held busy
        syncer.mark(path)
        syncer.request(20)
        assert entered.wait(10)
        syncer.mark(path)
        assert not syncer.sync_here(30)  # busy: nothing done here, the marked file left for it
        assert syncer.dirty == {path}
        release.set()
        syncer.request(30)
        syncer.flush_now(30)
        assert [offset for offset, _ in durable] == [10, 20, 30]
        assert durable[1][1] == durable[2][1] == "test-syncer"
    finally:
        syncer.close()


def test_a_failed_sync_in_the_callers_thread_is_told_once_and_the_thread_takes_no_more(tmp_path: Path) -> None:
    failures: list[str] = []
    syncer = FileSyncer("test", lambda offset: pytest.fail("a failed sync reported durable"),
                        on_failure=failures.append)
    syncer.mark(Path("/proc/version"))  # fdatasync of a proc file fails (EINVAL)
    assert syncer.sync_here(10)
    assert len(failures) == 1
    syncer.close()
