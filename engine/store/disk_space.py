"""How full the store's file system is: the one figure the writer's DISK_FULL refusals, retention,
the metrics and the dashboard all use.

A fact of the file system, not a decision: retention (``engine/services/writer/retention.py``) decides
with it, the monitor (``engine/metrics/collector.py``) reports it, so it lives below both.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple


class DiskSpace(NamedTuple):
    used_ratio: float  # what `df` prints as Use%: used / (used + available)
    free_bytes: int  # what `df` prints as Avail: blocks an unprivileged process may still take
    used_bytes: int


def disk_space(path: Path) -> DiskSpace:
    """The one definition of "disk used" (the writer's DISK_FULL ratio, the metrics, the dashboard).

    ``df``'s: the root-reserved blocks count neither as used nor as available, so on a file
    system with a large reserve the ratio is what an operator sees with ``df``, not
    (total - available) / total (which counts the reserve as used)."""
    stat = os.statvfs(path)
    used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
    free = stat.f_bavail * stat.f_frsize
    return DiskSpace(used / (used + free) if used + free else 0.0, free, used)


def disk_used_ratio(path: Path) -> float:
    return disk_space(path).used_ratio
