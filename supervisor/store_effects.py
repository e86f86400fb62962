"""The decisions that touch the store and the run directory rather than processes, carried out the
same way by the supervisor and by the simulation: both call ``carry_out``, so a cut of the log at a
change of role, the crash-start marker and the reset of the shared slots are production's code
in the simulation too."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from engine.coordination.role import Role
from engine.ipc import endpoints
from engine.ipc.endpoints import CRASH_START_FILE, REPLICA_APPEND_LOCK
from engine.logs import event
from engine.offline import truncate
from engine.store.append_fence import AppendFence
from engine.store.shared_offsets import SLOT_COUNT, SharedOffsets
from engine.store.unclean_stop import mark_crash_start
from supervisor.decisions import CrashStart, CutLog, Effect, ResetSlots

log = logging.getLogger("supervisor")


def carry_out(effect: Effect, store_dir: Path, run_dir: Path, slots: SharedOffsets) -> bool:
    """Carry out ``effect`` if it is one of the store's; False if it is not (a process's)."""
    match effect:
        case ResetSlots(kept=kept):
            for slot in range(SLOT_COUNT):
                if slot not in kept:
                    slots.set(slot, 0)
        case CutLog(role=role):
            cut_log(store_dir, run_dir, role)
        case CrashStart(on=on, power_loss=power_loss):
            mark_crash_start(run_dir / CRASH_START_FILE, on, power_loss=power_loss)
        case _:
            return False
    return True


def forks(store_dir: Path, run_dir: Path, role: Role) -> bool:
    """``ForkCheck``: whether the replica's log forks from ``role``'s history, looked at while its
    writer appends nothing (``engine/store/append_fence.py``): a chunk of the old master's still on
    its way is in the log by then, or refused for its epoch."""
    fence = AppendFence(run_dir / REPLICA_APPEND_LOCK)
    try:
        with fence.held():
            point = truncate.fork_point(store_dir, role)
    finally:
        fence.close()
    if point is not None:
        log.warning("the log forks from the master's of epoch %d at %d: every actor starts again",
                    role.epoch, point, extra=event("role.log_forks", epoch=role.epoch, offset=point))
    return point is not None


def cut_log(store_dir: Path, run_dir: Path, role: Role) -> int | None:
    """``prepare_for_role``; where it cuts the log, every actor recovers as after an unclean stop
    (queue units and index items past the cut go). The offset it cut at, or None."""
    point = truncate.prepare_for_role(store_dir, role)
    if point is not None:
        mark_crash_start(run_dir / CRASH_START_FILE, True)
        log.warning("the log forked from the master's of epoch %d at %d: cut there", role.epoch, point,
                    extra=event("role.log_cut", epoch=role.epoch, offset=point))
    return point


def fresh_run_dir(store_dir: Path) -> Path:
    """The run directory as a start needs it: empty, a killed engine's sockets and files gone, and
    its shared offsets marked over first (a reader on the host that mapped them reads afresh)."""
    run_dir = endpoints.ensure_run_dir(store_dir)
    SharedOffsets.mark_run_over(run_dir)
    for stale in run_dir.iterdir():  # a killed engine's sockets and files, and its metrics/
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale)
        else:
            stale.unlink()
    return run_dir
