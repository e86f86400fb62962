"""Each host's wall clock, moved on command: Debian's libfaketime in every process of what a host
runs, reading the host's offset from a file of its own.

    <bed root>/clock-<host>      "+0", "-3600", "+3600": seconds the wall clock is off by
    <bed root>/clock-site/       a sitecustomize for Python processes under the clock (below)

Only the wall clock moves (``FAKETIME_DONT_FAKE_MONOTONIC``): ``time.time``, the store timestamps,
retention and timers jump; ``time.monotonic`` (deadlines, the master's lease) runs on. A process
reads its file at most once a second (``FAKETIME_CACHE_DURATION``), so a jump is in place within
``JUMP_SETTLE_S``.

libfaketime 0.9.10 (Debian 12) refuses ``clock_nanosleep`` on the monotonic clock with an
absolute deadline (EINVAL) when the monotonic clock is not faked, and that is how CPython's
``time.sleep`` waits; the site module makes ``time.sleep`` wait in ``select`` instead.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

JUMP_SETTLE_S = 1.5  # FAKETIME_CACHE_DURATION (1 s) and a margin

SLEEP_IN_SELECT = '''
import select as _select
import time as _time


def _sleep(seconds):
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    _select.select([], [], [], seconds)


_time.sleep = _sleep
'''


def library() -> str | None:
    """libfaketime's path on this machine, or None."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


class HostClocks:
    """The wall clocks of a bed's hosts, each at an offset of its own (none at first)."""

    def __init__(self, root: Path, hosts: list[str]) -> None:
        preload = library()
        if preload is None:
            raise FileNotFoundError("libfaketime is not installed (Debian's faketime: make system-tools)")
        self.preload = preload
        self.root = root
        self.hosts = hosts
        self.offsets = dict.fromkeys(hosts, 0)

    def start(self) -> None:
        site = self.root / "clock-site"
        site.mkdir(parents=True, exist_ok=True)
        (site / "sitecustomize.py").write_text(SLEEP_IN_SELECT)
        for host in self.hosts:
            self.set(host, 0)

    def environment(self, host: str) -> dict[str, str]:
        """What a process on ``host`` runs with to read its wall clock from the host's file."""
        return {"LD_PRELOAD": self.preload, "FAKETIME_TIMESTAMP_FILE": str(self.file(host)),
                "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                "PYTHONPATH": str(self.root / "clock-site")}

    def set(self, host: str, offset_s: int) -> None:
        """``host``'s wall clock ``offset_s`` seconds off the real one (written whole: a process
        never reads half a file)."""
        path = self.file(host)
        temporary = path.with_suffix(".new")
        temporary.write_text(f"{offset_s:+d}\n")
        os.replace(temporary, path)
        self.offsets[host] = offset_s

    def reset(self) -> None:
        for host, offset_s in self.offsets.items():
            if offset_s:
                self.set(host, 0)

    def file(self, host: str) -> Path:
        return self.root / f"clock-{host}"
