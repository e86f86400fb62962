"""Fault injection on a running engine and on its files: kills, pauses, power cuts, corruption.

* ``kill_actor`` / ``pause_actor``: SIGKILL or SIGSTOP an actor by name, found
  through the supervisor's status;
* ``flushed_offset_after_kill``: after everything was killed, how far the
  flusher had flushed the log (read from the run directory's shared offsets,
  the engine's own record of it);
* ``simulate_power_loss``: on a stopped store, drop what a power cut could
  drop: every 4 KiB page of the log past the flushed offset is kept, zeroed
  or garbled at random (the kernel writes dirty pages back in any order), and
  queues lose a random part of the units that point past it. The store's
  abort marker then names another boot, as after the machine came back.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import psutil

from engine.ipc import endpoints
from engine.ipc.control import control
from engine.ipc.messages import StatusQuery
from engine.layout import CQ_UNIT, CQ_UNIT_BYTES
from engine.offline.truncate import ABORT_MARKER
from engine.store.commit_log import COMMIT_LOG_DIR
from engine.store.consume_queue import CONSUME_QUEUE_DIR
from engine.store.mapped_file import PAGE_BYTES, list_files
from engine.store.shared_offsets import FLUSHED, SharedOffsets

ROLES = ("writer", "flusher", "owner", "index", "reput", "front", "supervisor")


def actor_pids(store_dir: Path) -> dict[str, int]:
    """Actor name -> pid (and ``supervisor``) of the engine running on ``store_dir``."""
    pids = {a.name: a.pid for a in control(store_dir, StatusQuery()).actors if a.pid}
    pid = endpoints.read_engine_state(store_dir)["pid"]
    assert isinstance(pid, int), pid  # written as os.getpid()
    pids["supervisor"] = pid
    return pids


def processes_running(supervisor_pid: int, module: str) -> set[int]:
    """Every process of the supervisor that runs the actor ``module``, those waiting at their
    start gates (spares, standby ones) too."""
    return {child.pid for child in psutil.Process(supervisor_pid).children() if module in child.cmdline()}


def resolve(store_dir: Path, role: str, rng: random.Random) -> tuple[str, int]:
    """A concrete actor for a role: ``owner`` picks one owner, ``random`` any actor or the supervisor."""
    pids = actor_pids(store_dir)
    if role == "random":
        name = rng.choice(sorted(pids))
    elif role == "owner":
        name = rng.choice(sorted(n for n in pids if n.startswith("owner-")))
    else:
        name = role
    if name not in pids:
        raise KeyError(f"no actor {name!r}; running: {', '.join(sorted(pids))}")
    return name, pids[name]


def kill_actor(store_dir: Path, role: str, *, rng: random.Random | None = None,
               sig: signal.Signals = signal.SIGKILL) -> tuple[str, int]:
    name, pid = resolve(store_dir, role, rng or random.Random())
    os.kill(pid, sig)
    return name, pid


def pause_actor(store_dir: Path, role: str, *, rng: random.Random | None = None) -> tuple[str, psutil.Process]:
    name, pid = resolve(store_dir, role, rng or random.Random())
    process = psutil.Process(pid)
    process.suspend()
    return name, process


def flushed_offset_after_kill(store_dir: Path) -> int:
    run_dir = endpoints.run_dir_for(store_dir)
    offsets = SharedOffsets(run_dir)
    try:
        return offsets.get(FLUSHED)
    finally:
        offsets.close()


def _mangle_page(path: Path, page_start: int, length: int, rng: random.Random, *, garble_ratio: float,
                 zero_ratio: float) -> str:
    draw = rng.random()
    if draw < zero_ratio:
        data, fate = bytes(length), "zeroed"
    elif draw < zero_ratio + garble_ratio:
        data, fate = rng.randbytes(length), "garbled"
    else:
        return "kept"
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, page_start)
    finally:
        os.close(fd)
    return fate


def simulate_power_loss(store_dir: Path, *, flushed_offset: int, rng: random.Random,
                        zero_ratio: float = 0.6, garble_ratio: float = 0.2) -> dict[str, int]:
    """Mangle what was never flushed, page by page; returns how many pages met each fate."""
    fates: dict[str, int] = {"kept": 0, "zeroed": 0, "garbled": 0}
    for start, path in list_files(store_dir / COMMIT_LOG_DIR):
        size = path.stat().st_size
        first = max(flushed_offset - start, 0)
        if first >= size:
            continue
        # The page holding the flushed offset is partly durable: only its tail may go.
        first_page = first - first % PAGE_BYTES
        for page in range(first_page, size, PAGE_BYTES):
            lo = max(page, first)
            if not _page_has_data(path, page):
                continue
            fate = _mangle_page(path, lo, page + PAGE_BYTES - lo, rng, garble_ratio=garble_ratio,
                                zero_ratio=zero_ratio)
            fates[fate] += 1
    for queue_dir in (store_dir / CONSUME_QUEUE_DIR).glob("*/*"):
        for _start, path in list_files(queue_dir):
            _mangle_queue_file(path, flushed_offset, rng, fates)
    abort = store_dir / ABORT_MARKER
    if abort.exists():  # the machine went down: the next start is on another boot
        abort.write_text("pid 0\nboot simulated-power-cut\n")
    return fates


def _page_has_data(path: Path, page: int) -> bool:
    with open(path, "rb") as f:
        f.seek(page)
        return bool(f.read(PAGE_BYTES).strip(b"\x00"))


def _mangle_queue_file(path: Path, flushed_offset: int, rng: random.Random, fates: dict[str, int]) -> None:
    """Units are appended in log order, so the ones past the flushed offset are a suffix:
    a power cut keeps a random prefix of that suffix (an older version of the page)."""
    data = path.read_bytes()
    units = list(CQ_UNIT.iter_unpack(data))
    at_risk = [i for i, (offset, size, _code) in enumerate(units) if size > 0 and offset + size > flushed_offset]
    if not at_risk:
        return
    keep = rng.randrange(len(at_risk) + 1)
    lost = at_risk[keep:]
    fates["kept"] += keep
    fates["zeroed"] += len(lost)
    if lost:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, bytes(CQ_UNIT_BYTES * (len(units) - lost[0])), lost[0] * CQ_UNIT_BYTES)
        finally:
            os.close(fd)
