"""Cut a stopped store's CommitLog back to an offset: what a broker does before it follows a new
master whose log forks from its own there (``engine/store/epoch_file.py``, ``truncation_point``).

The bytes from the offset to where the segment's data ends are zeroed (never a shrink: a file
keeps its length), later segments are deleted, and the checkpoint is brought down to the
offset, so that the recovery after it (an unclean one: the caller makes it so) scans from
there, rebuilds the ConsumeQueue units and IndexFiles past it, and ends the log there (the
abort marker is left, so that the next start recovers as after an unclean stop). The engine's
actors must not be running: the caller holds the store's lock without them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from engine.coordination.role import Role
from engine.store.checkpoint import CheckpointError, load_checkpoint, store_checkpoint
from engine.store.commit_log import COMMIT_LOG_DIR
from engine.store.epoch_file import add_epoch, load_epochs, save_epochs, trim_epochs, truncation_point
from engine.store.mapped_file import fsync_dir

log = logging.getLogger(__name__)
_ZEROS = bytes(1 << 20)
ABORT_MARKER = "abort"  # the supervisor's: present at a start, the actors recover as after an unclean stop


def prepare_for_role(store_dir: Path, role: Role) -> int | None:
    """Before the actors of ``role`` start (none but the membership actor running): a master notes
    where its epoch starts; a replica's log is cut where it forks from its new master's. The offset
    it was cut at (its actors must then recover as after an unclean stop), or None."""
    if role.is_master:
        add_epoch(store_dir, role.epoch, dict(role.history).get(role.epoch, 0))
        return None
    point = truncation_point(load_epochs(store_dir), role.history)
    if point is None or not truncate_log(store_dir, point):
        return None
    save_epochs(store_dir, trim_epochs(load_epochs(store_dir), point))
    return point


def fork_point(store_dir: Path, role: Role) -> int | None:
    """Where ``prepare_for_role`` would cut a replica's log for ``role`` (None: it would not),
    without cutting: the log is only read (its actors may be running)."""
    if role.is_master:
        return None
    point = truncation_point(load_epochs(store_dir), role.history)
    return point if point is not None and _has_data_from(store_dir, point) else None


def _has_data_from(store_dir: Path, offset: int) -> bool:
    """Whether the log holds a byte at or past ``offset`` (what ``truncate_log`` would drop)."""
    directory = store_dir / COMMIT_LOG_DIR
    if not directory.is_dir():
        return False
    for start in reversed(_segment_starts(directory)):
        path = directory / f"{start:020d}"
        if start >= offset:
            if _holds_data_at(path, 0):
                return True
            continue
        return _holds_data_at(path, offset - start)
    return False


def _segment_starts(directory: Path) -> list[int]:
    return sorted(int(entry.name) for entry in os.scandir(directory) if entry.name.isdigit())


def _holds_data_at(path: Path, position: int) -> bool:
    """Whether a record (or a blank tail) begins at ``position``: its first bytes, the size, are not
    zero. A segment written ahead of the log (the next one, reserved) reads as zeros."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return any(os.pread(fd, 4096, position))
    finally:
        os.close(fd)


def truncate_log(store_dir: Path, offset: int) -> int:
    """Cut the log at ``offset``; how many bytes past it held data (0: nothing to cut)."""
    directory = store_dir / COMMIT_LOG_DIR
    if not directory.is_dir():
        return 0
    cut = 0
    for start in reversed(_segment_starts(directory)):
        path = directory / f"{start:020d}"
        if start >= offset:
            cut += _data_end(path) if _holds_data_at(path, 0) else 0  # not a segment reserved ahead, unwritten
            path.unlink()
            continue
        cut += _zero_from(path, offset - start)
        break
    if cut:
        fsync_dir(directory)
        _lower_checkpoint(store_dir, offset)
        abort = store_dir / ABORT_MARKER
        if not abort.exists():  # the next start recovers as after a crash (a running supervisor's note stays)
            abort.write_text("the log was cut\n")
        log.warning("commit log cut at %d: %d bytes past it dropped", offset, cut)
    return cut


def _data_end(path: Path) -> int:
    """Where the file's data ends: its first hole (blocks reserved ahead of the writes read as zeros)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE)
    finally:
        os.close(fd)


def _zero_from(path: Path, position: int) -> int:
    fd = os.open(path, os.O_RDWR)
    try:
        end = os.lseek(fd, position, os.SEEK_HOLE) if position < os.fstat(fd).st_size else position
        had_data = any(os.pread(fd, min(4096, end - position), position)) if end > position else False
        pos = position
        while pos < end:
            pos += os.pwrite(fd, _ZEROS[:min(len(_ZEROS), end - pos)], pos)
        os.fsync(fd)
        return end - position if had_data else 0
    finally:
        os.close(fd)


def _lower_checkpoint(store_dir: Path, offset: int) -> None:
    try:
        checkpoint = load_checkpoint(store_dir)
    except CheckpointError:
        return  # recovery scans the whole log without one
    if checkpoint is None:
        return
    store_checkpoint(store_dir, dataclasses.replace(
        checkpoint, flushed_offset=min(checkpoint.flushed_offset, offset),
        dispatched_offset=min(checkpoint.dispatched_offset, offset),
        confirm_phy_offset=min(checkpoint.confirm_phy_offset, offset),
        master_flushed_offset=min(checkpoint.master_flushed_offset, offset)))
