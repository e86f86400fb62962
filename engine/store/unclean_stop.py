"""What an unclean stop may have left: a killed process's writes, or a power cut's.

A process killed with SIGKILL loses nothing it wrote to a mapped file: the page cache holds it
and writes it back. Past the log's end there is then at most the torn batch the killed writer
was writing. A power cut (or a kernel crash) loses the dirty pages the kernel had not written
back, in any order: a stale page can survive beyond a zeroed one, and only a sweep of the rest
of the segment finds it (``commit_log._zero_garbage``). The sweep reads the whole segment, 2 s
for a 1 GiB one: a failover must not pay it when no machine went down.

The two are told apart by the kernel's boot id: the supervisor notes it in the store's ``abort``
marker while it runs, and a start that finds the marker with the same boot id follows a crash of
processes only. A marker without a boot id (written by an older engine, or by the log cut of
``truncate``) or with another one may follow a power cut.

The run directory's ``crash-start`` marker (``marker`` below) tells the actors which it was,
until each recovered::

    crash-start   "killed\\n"       processes were killed (an engine's crash, a change of role)
                  "power-loss\\n"   the machine may have gone down since the store was last open
"""

from __future__ import annotations

import os
from pathlib import Path

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
KILLED = "killed"
POWER_LOSS = "power-loss"
_BOOT_PREFIX = "boot "


def boot_id() -> str:
    """This boot's id ("" where the kernel does not say)."""
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return ""


def abort_note() -> str:
    """What the supervisor writes in the store's ``abort`` marker at its start."""
    return f"pid {os.getpid()}\n{_BOOT_PREFIX}{boot_id()}\n"


def power_loss_possible(abort_text: str) -> bool:
    """Whether the machine may have gone down since the ``abort`` marker holding ``abort_text``
    was written: True unless it names this boot."""
    noted = [line[len(_BOOT_PREFIX):] for line in abort_text.splitlines() if line.startswith(_BOOT_PREFIX)]
    current = boot_id()
    return not (current and noted == [current])


def mark_crash_start(marker: Path, on: bool, *, power_loss: bool = False) -> None:
    """The ``crash-start`` marker on or off. One that says ``power-loss`` stays so until it is
    taken off: a later kill does not make the earlier power cut any less."""
    if not on:
        marker.unlink(missing_ok=True)
        return
    if not power_loss and crash_start_kind(marker) == POWER_LOSS:
        return
    marker.write_text((POWER_LOSS if power_loss else KILLED) + "\n")


def crash_start_kind(marker: Path) -> str:
    """``KILLED``, ``POWER_LOSS``, or "" (a clean start: no marker)."""
    try:
        text = marker.read_text().strip()
    except FileNotFoundError:
        return ""
    return KILLED if text == KILLED else POWER_LOSS  # anything else: the careful reading
