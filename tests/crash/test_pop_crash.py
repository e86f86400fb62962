"""SIGKILL the owner of pop state, or the whole engine, during pop and ack traffic.

No message may be lost for the group (every stored one is acked in the end); under
SYNC_FLUSH no message whose ack was confirmed is delivered again; ``check_store``
(which checks journals and segments too) finds nothing afterwards.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.config import StoreConfig
from engine.ipc.control import EventStream
from engine.offline.check import check_store
from harness.faults import kill_actor
from harness.pop_workload import MessageKey, PopLedger, PopWorker, drain
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(240)

TOPIC = "pop-crash"
MESSAGES = 6_000


def pop_config(flush_mode: str) -> StoreConfig:
    # A small journal limit: folds (and deletions of done segments) happen during the run.
    return StoreConfig.test_min().replace(flush_mode=flush_mode, pop_journal_entries_max=2_000,
                                          pop_journal_idle_fold_ms=300)


def load(engine: EngineProcess) -> set[MessageKey]:
    stored = set()
    with engine.client() as client:
        client.create_topic(TOPIC, queue_count=4)
        for start in range(0, MESSAGES, 500):
            for result in client.send(TOPIC, [{"body": b"m-%06d" % n} for n in range(start, start + 500)]):
                stored.add((TOPIC, result["queue_id"], result["queue_offset"]))
    return stored


def wait_acked(ledger: PopLedger, count: int, workers: list[PopWorker]) -> None:
    while len(ledger.acked_at) < count:
        assert any(worker.is_alive() for worker in workers)
        workers[0].idle.wait(0.05)


@pytest.mark.parametrize("flush_mode", ["ASYNC_FLUSH", pytest.param("SYNC_FLUSH", marks=pytest.mark.slow)])
@pytest.mark.parametrize("victim", ["owner", pytest.param("engine", marks=pytest.mark.slow)])
def test_a_kill_during_pop_and_ack_loses_nothing(store_dir: Path, flush_mode: str, victim: str) -> None:
    config = pop_config(flush_mode)
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    try:
        stored = load(engine)
        ledger = PopLedger(strict_since=0.0 if flush_mode == "SYNC_FLUSH" else float("inf"))
        workers = [PopWorker(engine, "crash-g", TOPIC, ledger, invisible_ms=2_000) for _ in range(2)]
        for worker in workers:
            worker.start()
        for round_ in range(2):
            wait_acked(ledger, (round_ + 1) * 1_500, workers)
            if victim == "owner":
                events = EventStream(store_dir)
                name, _pid = kill_actor(store_dir, "owner", rng=random.Random(round_))
                assert events.wait_for("actor.exited", name=name).exit_code == -9
                events.wait_for("recovery.done", name=name)
                events.close()
            else:
                engine.kill()  # every actor and the supervisor, at once
                engine.start()
        drained = drain(engine, workers, ledger, stored, group="crash-g", topic=TOPIC, queue_count=4, timeout_s=90)
        for worker in workers:
            worker.stop()
        verdict = ledger.verdict(stored)
        assert verdict.ok(redelivery_after_ack_allowed=flush_mode == "ASYNC_FLUSH"), verdict.summary()
        assert drained, f"the engine's counts say some messages are not acked; {verdict.summary()}"
        assert engine.stop() == 0
        findings = check_store(store_dir, config)
        assert findings == [], "\n".join(map(str, findings))
    finally:
        engine.stop()
