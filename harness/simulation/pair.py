"""A master and its replica in one simulation (docs/replication.md).

The replica is a second ``World`` beside the master's, on the same network, clock and step
counts (its actors go by ``replica/<name>``), following the master's replication endpoint.
Kills fall on either engine's actors, power cuts on the replica only: a master that loses
confirmed bytes it had shipped leaves its replica ahead of it, which only epochs and the
truncation of a diverged log (not built yet) can repair. After every settle both engines
have caught up, and the replica's invariants are checked: its log is the master's byte for
byte, and its own queues and index agree with it (``checks.violations``).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from engine.config import StoreConfig
from engine.store import sync
from engine.store.commit_log import CommitLogReader
from engine.store.shared_offsets import CONFIRMED, WRITTEN
from harness.simulation.checks import violations
from harness.simulation.workload import Workload
from harness.simulation.world import World

REPLICATION_ENDPOINT = "tcp://sim-master:10912"
SETTLE_ROUNDS_MAX = 400
SETTLE_STEPS_A_TURN = 300
TICKS_MS = 300  # longer than every actor's tick interval


def master_config_for(config: StoreConfig, replication_mode: Literal["ASYNC", "SYNC"]) -> StoreConfig:
    """The master's settings of a pair: replicas connect at ``REPLICATION_ENDPOINT``."""
    return config.replace(replication_endpoint=REPLICATION_ENDPOINT, replication_mode=replication_mode,
                                replication_report_interval_ms=100, replication_config_interval_ms=200)


def replica_beside(master: World, root: Path, rng: random.Random, *, page_written_back_ratio: float) -> World:
    config = master.config.replace(replication_endpoint="", replication_mode="ASYNC", replica_of=REPLICATION_ENDPOINT)
    return World(root, rng, config, publication_loss_ratio=0.0, page_written_back_ratio=page_written_back_ratio,
                 beside=master, prefix="replica/")


@contextlib.contextmanager
def disks_listening(world: World, replica: World | None) -> Iterator[None]:
    """Every sync of a data file told to the disk of the engine whose store holds it (one listener
    for both: ``engine/store/sync.py`` takes one)."""
    if replica is None:
        with world.disk:
            yield
        return

    def on_sync(path: Path, start: int, end: int | None) -> None:
        disk = replica.disk if path.is_relative_to(replica.store_dir) else world.disk
        disk.on_sync(path, start, end)

    sync.listen(on_sync)
    try:
        yield
    finally:
        sync.listen(None)


def settle_pair(master: World, replica: World) -> bool:
    """Both engines quiet, and the replica's log where the master's is; False if that never comes."""
    for _ in range(SETTLE_ROUNDS_MAX):
        # Each in turn, a bounded while: under SYNC replication the master settles only once the
        # replica has caught up (its readers wait for it), and the replica only with the master's sends.
        master.settle(SETTLE_STEPS_A_TURN)
        replica.settle(SETTLE_STEPS_A_TURN)
        caught_up = replica.slots.get(WRITTEN) == master.slots.get(CONFIRMED)
        if caught_up and not master.network.busy() and master.quiet() and replica.quiet():
            # A tick of every actor of both: a deletion table the writer saved last (the master's own,
            # or the one a replica adopted) its owners follow on their next tick or batch; under SYNC
            # replication the batch waits for the replica, so a tick may come first.
            pass_time_pair(master, replica, TICKS_MS)
            if replica.slots.get(WRITTEN) == master.slots.get(CONFIRMED) and master.quiet() and replica.quiet():
                return True
        master.tick_one()  # time for the replica's next report and the master's next send
        replica.tick_one()
    return False


def pass_time_pair(master: World, replica: World, ms: int) -> None:
    """``World.pass_time`` for both engines, in turns of 100 ms (the replica keeps up meanwhile)."""
    until = master.clock.mono_ms() + ms
    while master.clock.mono_ms() < until:
        master.pass_time(100)
        replica.pass_time(100)


def replica_violations(master: World, replica: World, workload: Workload) -> list[str]:
    end = master.slots.get(CONFIRMED)
    found = [f"replica: {v}" for v in violations(replica.store_dir, replica.config, workload,
                                                  replica.slots.get(CONFIRMED), client=False)]
    differs = segment_differing(replica, master, end)
    if differs is not None:
        found.append(f"replica: its log differs from the master's in the segment at {differs}")
    return found


def segment_differing(replica: World, master: World, end: int) -> int | None:
    """The start of the first segment where the two logs differ below ``end``, byte for byte
    (None: the replica's log up to ``end`` is the master's)."""
    ours = CommitLogReader.for_config(replica.store_dir, replica.config)
    theirs = CommitLogReader.for_config(master.store_dir, master.config)
    try:
        start = max(ours.min_offset(), theirs.min_offset())
        size = master.config.segment_size_bytes
        for segment_start in range(start - start % size, end, size):
            a, b = ours.segment_at(segment_start), theirs.segment_at(segment_start)
            stop = min(size, end - segment_start)
            if a is None or b is None or a.mm[:stop] != b.mm[:stop]:
                return segment_start
        return None
    finally:
        ours.segments.close()
        theirs.segments.close()
