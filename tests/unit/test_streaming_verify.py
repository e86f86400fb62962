"""``verify_streaming``: the same verdict as ``verify``, in memory that does not grow with the run.

The acknowledgements live in an ``AckLog`` file and each queue is read once,
page by page; the tests run a real engine (``StoreConfig.test_min()``), make a
loss and a duplicate real, and measure the checker's Python allocations with
``tracemalloc`` for N and for 10·N messages.
"""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.workload import AckLog, Producer, make_body, read_everything, verify, verify_streaming
from supervisor.launcher import EngineProcess
from tests.helpers import wait_dispatched

pytestmark = pytest.mark.timeout(120)

TOPICS = {"stream": 2}


def peak_bytes(work: Callable[[], object]) -> tuple[int, object]:
    tracemalloc.start()
    try:
        result = work()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def test_the_streaming_verdict_matches_the_in_memory_one_and_finds_a_loss_and_a_duplicate(
        engine: EngineProcess, tmp_path: Path) -> None:
    with engine.client() as client:
        producer = Producer("p", client, TOPICS, random.Random(3), batch_size=20)
        for _ in range(30):
            producer.send_batch()
        assert len(producer.acked) == 600
        # A loss: an ack for a queue offset the engine never assigned (seq never sent).
        lost_id = ("p", producer.next_seq + 7)
        producer.acked[lost_id] = ("stream", 1, 10_000)
        producer.acked_log_offsets[lost_id] = 0
        # A duplicate: an acknowledged message stored a second time, in its own queue.
        duplicate_id = ("p", 42)
        topic, queue_id, _offset = producer.acked[duplicate_id]
        stored = client.send(topic, [{"body": make_body(*duplicate_id, 256)}], queue_id=queue_id)
        assert stored[0]["status"] == "PUT_OK"
        wait_dispatched(client)

        ack_log = AckLog(tmp_path / "acks", "p", TOPICS)
        for (_name, seq), (topic, queue_id, queue_offset) in producer.acked.items():
            ack_log.record(seq, topic, queue_id, queue_offset, producer.acked_log_offsets[(_name, seq)])
        streamed = verify_streaming(client, TOPICS, [ack_log])
        in_memory = verify([producer], read_everything(client, TOPICS))
        ack_log.close()

    assert streamed.summary() == in_memory.summary()
    assert not streamed.ok()
    assert streamed.acked == 601 and streamed.read == 601
    assert streamed.lost == [lost_id]
    assert streamed.storage_duplicates == [duplicate_id]
    assert len(streamed.misplaced) == 1 and str(duplicate_id) in streamed.misplaced[0]
    assert streamed.corrupt == [] and streamed.holes == []


def test_verify_takes_a_resent_messages_first_copy_for_at_least_once_and_any_other_copy_for_a_duplicate(
        engine: EngineProcess) -> None:
    """A client that sent a batch again after its connection broke (``Producer.resent``) may find it
    stored twice: the first copy, before the acknowledged one, is counted, not failed."""
    with engine.client() as client:
        producer = Producer("p", client, TOPICS, random.Random(5), batch_size=10)
        for _ in range(5):
            producer.send_batch()
        resent_id = ("p", producer.next_seq - 1)  # the last one sent: its copy comes next, as a resend's does
        topic, queue_id, _offset = producer.acked[resent_id]
        [copy] = client.send(topic, [{"body": make_body(*resent_id, 256)}], queue_id=queue_id)
        wait_dispatched(client)
        producer.acked[resent_id] = (topic, queue_id, copy["queue_offset"])  # the resend's acknowledgement
        stored = read_everything(client, TOPICS)
    unmarked = verify([producer], stored)
    assert unmarked.storage_duplicates == [resent_id] and not unmarked.ok()
    producer.resent.add(resent_id)
    marked = verify([producer], stored)
    assert marked.ok(), marked.summary()
    assert marked.resent_copies == 1 and marked.acked == marked.read - 1 == 50


def test_streaming_verification_memory_does_not_grow_with_the_message_count(
        engine: EngineProcess, tmp_path: Path) -> None:
    count = 1_000  # 500 a queue: the pull pages (256 messages) are full from the first run on
    ack_log = AckLog(tmp_path / "acks", "p", TOPICS)
    with engine.client() as client:
        producer = Producer("p", client, TOPICS, random.Random(4), body_sizes=(1024,), batch_size=50,
                            ack_log=ack_log)
        peaks = {}
        for total in (count, 10 * count):
            while producer.acked_count < total:
                producer.send_batch()
            wait_dispatched(client)
            peaks[total], verdict = peak_bytes(lambda: verify_streaming(client, TOPICS, [ack_log]))
            assert verdict.ok(), verdict.summary()
            assert verdict.acked == verdict.read == total
        in_memory_peak, _read = peak_bytes(lambda: read_everything(client, TOPICS))
    ack_log.close()

    assert producer.acked == {} and producer.unknown == set(), "an AckLog producer keeps nothing per message"
    assert peaks[10 * count] < 1.5 * peaks[count], peaks
    # The measure sees a growing checker: holding every body read is at least 10 MB here.
    assert in_memory_peak > 10 * count * 1024 > 4 * peaks[10 * count], (in_memory_peak, peaks)
