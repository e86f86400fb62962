"""An overloaded writer answers BUSY and stores nothing; the producer retries such sends.

The engine runs with ``send_queue_wait_ms_max`` = 20 ms, and a producer puts 100 large
batches in flight at once (``send_batch_async``): the writer cannot store them all within
20 ms of their arrival, so it refuses the late ones with BUSY, as it would under any load.
Whether a given flood overloads it depends on the machine's moment, so each part floods
again (a few times at most) until it has seen what it checks.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest

from engine.config import StoreConfig
from rmqpy import EngineError, ErrorCode, OutgoingMessage, Producer, RetryPolicy, SendResult
from supervisor.launcher import EngineProcess
from tests.helpers import wait_dispatched

pytestmark = pytest.mark.timeout(120)

BATCHES = 100
BATCH = [OutgoingMessage(body=b"b" * 1000) for _ in range(200)]
FLOODS_MAX = 10


def flood(producer: Producer) -> list[concurrent.futures.Future[list[SendResult]]]:
    futures = [producer.send_batch_async("busy", BATCH, queue_id=0) for _ in range(BATCHES)]
    concurrent.futures.wait(futures, timeout=60)
    assert all(f.done() for f in futures)
    return futures


def test_busy_is_raised_without_retries_and_retried_until_stored_with_them(tmp_path: Path) -> None:
    config = StoreConfig.test_min().replace(send_queue_wait_ms_max=20)
    with EngineProcess(tmp_path / "busy", config=config) as engine:
        with engine.client() as client:
            client.create_topic("busy", queue_count=1)
        stored = 0

        refused: list[BaseException] = []
        with Producer(engine.endpoint, retry=RetryPolicy.never()) as producer:
            for _ in range(FLOODS_MAX):
                futures = flood(producer)
                refused += [e for f in futures if (e := f.exception()) is not None]
                stored += sum(len(f.result()) for f in futures if f.exception() is None)
                if refused:
                    break
        assert refused, "no flood overloaded the writer"
        assert all(isinstance(e, EngineError) and e.code == ErrorCode.BUSY for e in refused)

        retries: list[tuple[int, int, float]] = []
        policy = RetryPolicy(retry_count_max=30, backoff_ms_min=20, backoff_ms_max=500)
        with Producer(engine.endpoint, retry=policy,
                      on_retry=lambda error, n, pause_ms: retries.append((error.code, n, pause_ms))) as producer:
            for _ in range(FLOODS_MAX):
                futures = flood(producer)
                assert all(f.exception() is None for f in futures), [f.exception() for f in futures]
                offsets = {r.queue_offset for f in futures for r in f.result()}
                assert len(offsets) == BATCHES * len(BATCH)
                stored += len(offsets)
                if retries:
                    break
        assert retries, "no retried send met BUSY"
        assert {code for code, _, _ in retries} <= {ErrorCode.BUSY, ErrorCode.SERVICE_NOT_AVAILABLE}
        assert all(pause <= 500 for _, _, pause in retries)

        with engine.client() as client:
            wait_dispatched(client)
            assert client.queue_stats("busy", 0)["max_offset"] == stored, "each batch stored once, retried or not"
