"""What a file reader may see of a store directory, decided once per query plan on the driver.

A store directory is in one of four states, and each gives a different bound
on the CommitLog bytes a reader may decode (``read_end``):

* **live**: an engine runs on it on this machine (its run directory names a
  living supervisor). Readers stop at the writer's confirmed offset, read
  from the engine's shared offsets file (under ``SYNC_FLUSH``, at the smaller
  of confirmed and flushed: what the engine itself would serve). Bytes past
  it may be a batch being written.
* **crashed or running elsewhere**: the ``abort`` marker is there but no
  engine runs here. Readers stop at the checkpoint's flushed offset, the end
  of what is known to be complete and durable (a torn tail may follow it).
* **stopped**: no ``abort`` marker; the engine stopped cleanly. Every valid
  record counts, as recovery would keep it.
* **a copy from a RocketMQ broker**: the same as stopped (or crashed, if it
  was copied from a running broker, but then its checkpoint has no flushed
  offset of ours and the log is read up to its last valid record).

``dispatched_end`` is the offset below which every record is known to have
its ConsumeQueue unit; a reader may use the queues to skip segments only
below it. A live engine publishes it (its owners' applied offsets), a
crashed store has it in its checkpoint, and a cleanly stopped engine
dispatched everything (it removes its ``abort`` marker only then). A
RocketMQ broker dispatches in log order, so in its stopped store every
record below the end of the highest unit of any queue has its unit
(``dispatched_end`` is None: derive it from the queues).

Records of deleted topics (``engine.store.deleted_topics``) written before their
deletion are hidden, as the engine hides them.

The bounds are taken on the driver and shipped inside each partition, so an
executor never decides on its own how far to read.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from engine.config import ConfigError, StoreConfig, decode_config
from engine.ipc import endpoints
from engine.offline.inspect_store import detect_config
from engine.store.checkpoint import CheckpointError, load_checkpoint
from engine.store.commit_log import COMMIT_LOG_DIR
from engine.store.deleted_topics import DeletedTopics
from engine.store.shared_offsets import CONFIRMED, FLUSHED, OFFSETS_FILE, SLOT, owner_slot

ABORT_FILE = "abort"
RUN_CONFIG_FILE = "config.json"  # the supervisor's copy of the config it gave its actors

LIVE, CRASHED, STOPPED = "live", "crashed", "stopped"
EVERYTHING = 1 << 62  # an offset past any log


class StoreError(ValueError):
    """The path is not a readable store directory."""


@dataclass(frozen=True)
class StoreSnapshot:
    """A picklable description of a store's readable extent at one moment."""

    store_dir: str
    state: str  # LIVE, CRASHED or STOPPED
    segment_size_bytes: int
    consume_queue_file_units: int
    read_end: int | None  # no record ending past it is read; None: every valid record
    dispatched_end: int | None  # every record below it has its unit (None: the highest unit's end)
    deletion_offsets: dict[str, int] = field(default_factory=dict)
    config: StoreConfig | None = None  # the running engine's, when live
    ours: bool = False  # written by this engine, whose store times never decrease along the log

    @property
    def path(self) -> Path:
        return Path(self.store_dir)

    def hides(self, topic: str, commit_log_offset: int) -> bool:
        """True for a record of a deleted topic written before the deletion (engine.store.deleted_topics)."""
        deletion = self.deletion_offsets.get(topic)
        return deletion is not None and commit_log_offset < deletion

    def limit_for(self, segment_end: int) -> int:
        """How far a reader may decode inside a segment that ends at ``segment_end``."""
        return segment_end if self.read_end is None else min(segment_end, self.read_end)


def take_snapshot(path: str | os.PathLike[str], config: StoreConfig | None = None) -> StoreSnapshot:
    """Look at ``path`` now: its state, sizes and bounds. StoreError if it is not a store."""
    store_dir = Path(path).expanduser().resolve()
    if not (store_dir / COMMIT_LOG_DIR).is_dir():
        raise StoreError(f"{store_dir} is not a store directory: it has no {COMMIT_LOG_DIR}/ directory")
    deletion_offsets = DeletedTopics(store_dir).deletion_offsets
    live = _live_engine(store_dir)
    bounds = None
    if live is not None:
        try:
            bounds = _live_bounds(live[0], live[1])
        except FileNotFoundError:
            pass  # it stopped in the meantime: the abort marker (or its absence) decides below
    if live is not None and bounds is not None:
        engine_config = live[1]
        read_end, dispatched = bounds
        sized = detect_config(store_dir, engine_config)
        return StoreSnapshot(str(store_dir), LIVE, sized.segment_size_bytes, sized.consume_queue_file_units,
                             read_end, dispatched, deletion_offsets, engine_config, ours=True)
    sized = detect_config(store_dir, config or StoreConfig())
    flushed, dispatched = _checkpoint_offsets(store_dir)
    ours = bool(flushed or dispatched)  # our checkpoint extension is there
    if (store_dir / ABORT_FILE).exists():
        crashed_end = flushed if flushed else None
        return StoreSnapshot(str(store_dir), CRASHED, sized.segment_size_bytes, sized.consume_queue_file_units,
                             crashed_end, min(dispatched, flushed), deletion_offsets, ours=ours)
    return StoreSnapshot(str(store_dir), STOPPED, sized.segment_size_bytes, sized.consume_queue_file_units,
                         None, EVERYTHING if ours else None, deletion_offsets, ours=ours)


def _live_engine(store_dir: Path) -> tuple[Path, StoreConfig] | None:
    """The run directory and config of an engine running on ``store_dir`` on this machine."""
    try:
        state = endpoints.read_engine_state(store_dir)
    except endpoints.NotRunning:
        return None
    pid = state.get("pid")
    if not isinstance(pid, int) or not psutil.pid_exists(pid):
        return None  # a supervisor that was killed left its state file behind
    run_dir = endpoints.run_dir_for(store_dir)
    try:
        config = decode_config((run_dir / RUN_CONFIG_FILE).read_bytes())
    except (OSError, ConfigError, ValueError) as exc:
        raise StoreError(f"an engine (pid {pid}) runs on {store_dir} but its configuration in {run_dir} "
                         f"cannot be read: {exc}") from None
    return run_dir, config


def read_offset_slots(run_dir: Path, slots: list[int]) -> list[int]:
    """Values of the engine's shared offsets (engine.store.shared_offsets), read without creating anything."""
    fd = os.open(run_dir / OFFSETS_FILE, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            return [SLOT.unpack_from(mm, slot * SLOT.size)[0] for slot in slots]
    finally:
        os.close(fd)


def _live_bounds(run_dir: Path, config: StoreConfig) -> tuple[int, int]:
    """(read_end, dispatched_end) of a running engine.

    The owners' applied offsets are read before the confirmed offset: each only grows,
    and an owner never applies past what was confirmed, so dispatched <= read_end holds.
    """
    owners = [owner_slot(k) for k in range(config.consume_queue_owner_count)]
    applied = read_offset_slots(run_dir, owners)
    confirmed, flushed = read_offset_slots(run_dir, [CONFIRMED, FLUSHED])
    read_end = min(confirmed, flushed) if config.flush_mode == "SYNC_FLUSH" else confirmed
    dispatched = min(applied, default=0)
    assert dispatched <= confirmed, (dispatched, confirmed)
    return read_end, min(dispatched, read_end)


def _checkpoint_offsets(store_dir: Path) -> tuple[int, int]:
    """(flushed, dispatched) from our checkpoint extension; (0, 0) if absent or unusable."""
    try:
        checkpoint = load_checkpoint(store_dir)
    except CheckpointError:
        return 0, 0
    if checkpoint is None:
        return 0, 0
    return checkpoint.flushed_offset, checkpoint.dispatched_offset
