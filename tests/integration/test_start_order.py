"""The start spawns every actor at once and lets them recover wave by wave (docs/design.md 8.1).

An actor's process is spawned behind a start gate (a pipe, ``Supervisor._release``): its
interpreter and imports run while the earlier waves recover, and its recovery waits for its
wave. A start that fails before a wave lets the actors it holds go without their touching the
store.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.actors.specs import actor_specs
from engine.config import StoreConfig
from engine.store.commit_log import COMMIT_LOG_DIR
from engine.store.consume_queue import CONSUME_QUEUE_DIR
from engine.store.index_file import INDEX_DIR
from engine.store.timer_files import TIMER_LOG_DIR
from supervisor.launcher import EngineFailed, EngineProcess

pytestmark = pytest.mark.timeout(60)


def supervisor_lines(store_dir: Path, what: str) -> list[str]:
    """The names of the actors in the supervisor's "actor NAME <what>" lines, in the log's order."""
    text = (store_dir / "logs" / "supervisor.log").read_text()
    return re.findall(rf" actor (\S+) {what}", text)


def test_every_actor_is_spawned_before_the_first_recovers_and_they_recover_in_waves(
        engine: EngineProcess, store_dir: Path) -> None:
    specs = actor_specs(engine.config)
    log = (store_dir / "logs" / "supervisor.log").read_text()
    first_recovery = log.index(" actor writer recovered in ")
    assert sorted(supervisor_lines(store_dir, r"started \(pid")) == sorted(spec.name for spec in specs)
    assert log.rindex(" started (pid ") < first_recovery, "every process was spawned before the writer recovered"
    recovered = supervisor_lines(store_dir, "recovered in")
    waves = [next(spec.wave for spec in specs if spec.name == name) for name in recovered]
    assert waves == sorted(waves), f"recoveries out of wave order: {recovered}"


def test_a_start_that_fails_in_its_first_wave_lets_the_held_actors_go_untouched(store_dir: Path) -> None:
    (store_dir / COMMIT_LOG_DIR / f"{0:020d}").mkdir(parents=True)  # a segment the writer cannot open: it exits
    engine = EngineProcess(store_dir, config=StoreConfig.test_min(), start_timeout_s=30)
    with pytest.raises(EngineFailed, match="actor writer exited with code 1 while starting"):
        engine.start()
    stopped = supervisor_lines(store_dir, r"stopped \(pid")
    held = [spec.name for spec in actor_specs(engine.config) if spec.wave > 1]
    assert sorted(stopped) == sorted(held), "each held actor was let go and exited 0"
    for name in held:
        assert "the engine stopped before this actor's wave started" in (store_dir / "logs" / f"{name}.log").read_text()
    for directory in (CONSUME_QUEUE_DIR, INDEX_DIR, TIMER_LOG_DIR):
        assert not (store_dir / directory).exists(), f"a held actor created {directory}/"
