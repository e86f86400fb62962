"""The seeded simulation with a replica beside the engine (``harness/simulation/pair.py``): seeds pass in
both replication modes with the replica's actors killed and its power cut, and a replica that
misses its master's deletions, or appends what is not for its log's end, is caught."""

from __future__ import annotations

import pytest

from engine.services.replication.log_shipping import LogShipping
from engine.services.writer.log_appends import LogAppends
from harness.simulation import Plan, simulate

pytestmark = pytest.mark.timeout(300)


def replica_plan(seed: int, mode: str, **settled: object) -> Plan:
    return Plan.drawn(seed, steps=600, replica=True, replication_mode=mode, **settled)  # type: ignore[arg-type]


@pytest.mark.parametrize(("mode", "seeds"), [("ASYNC", range(10)), ("SYNC", range(10)),
                                           pytest.param("ASYNC", range(10, 60), marks=pytest.mark.slow),
                                           pytest.param("SYNC", range(10, 60), marks=pytest.mark.slow)])
def test_seeds_with_a_replica_keep_every_invariant(mode: str, seeds: range) -> None:
    failures, replica_kills, replica_cuts = [], 0, 0
    for seed in seeds:
        outcome = simulate(seed, replica_plan(seed, mode))
        if not outcome.ok:
            failures.append((seed, outcome.violations[:3]))
        replica_kills += sum("kill replica/" in line for line in outcome.trace)
        replica_cuts += sum("power cut (the replica)" in line for line in outcome.trace)
    assert not failures, f"replay with scripts/simulate.py --replica {mode} --seed N --trace: {failures}"
    assert replica_kills >= len(seeds) and replica_cuts >= len(seeds) // 4, \
        "the runs must kill the replica's actors and cut its power"


def test_a_replica_that_misses_its_masters_deletions_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The order the deletion table depends on, broken on purpose: the master never sends it, and
    the replica's writer appends whatever table the bytes were sent with. A deleted topic's queues
    then start again at 0 on the master and not on the replica."""
    monkeypatch.setattr(LogShipping, "deletion_table_change", lambda self, replica: None)
    real = LogAppends.append_replicated

    def any_table(self: LogAppends, offset: int, data: bytes, *, deletions_crc: int, own_deletions_crc: int) -> str:
        return real(self, offset, data, deletions_crc=own_deletions_crc, own_deletions_crc=own_deletions_crc)

    monkeypatch.setattr(LogAppends, "append_replicated", any_table)
    caught = any(any("replica: " in v for v in simulate(seed, replica_plan(seed, "ASYNC", mix=_DELETING)).violations)
                 for seed in range(30))  # stops at the first seed that does
    assert caught, "the simulation missed a replica that never followed a topic deletion"


@pytest.mark.slow  # 5 s
def test_a_replica_that_appends_bytes_not_for_its_end_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one rule of a replica's writer, broken on purpose: a chunk sent for another offset than
    the log's end (one sent again after a restart) is appended at the end, past the writer's checks
    (its check of each record's physical offset would refuse it there)."""
    real = LogAppends.append_replicated

    def anywhere(self: LogAppends, offset: int, data: bytes, *, deletions_crc: int, own_deletions_crc: int) -> str:
        if offset == self.log.written_offset or deletions_crc != own_deletions_crc:
            return real(self, offset, data, deletions_crc=deletions_crc, own_deletions_crc=own_deletions_crc)
        self.log.append_raw(data)
        return ""

    monkeypatch.setattr(LogAppends, "append_replicated", anywhere)
    caught = any(not simulate(seed, replica_plan(seed, "ASYNC")).ok for seed in range(30))
    assert caught, "the simulation missed a replica that appended chunks twice"


# sends and topic deletions, little else: a deletion is met in most seeds
_DELETING = (0.02, 0.3, 0.0, 0.0, 0.02, 0.0, 0.05, 0.05, 0.05, 0.5)
