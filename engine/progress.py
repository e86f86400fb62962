"""Progress bars for what a person waits on at a terminal (``engine check``), drawn by tqdm.

Quiet unless stderr is a terminal, and with ``--json``: scripts and pipes see only results.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

# stage -> (unit, scale with k/M/G prefixes)
_UNITS = {"log": ("B", True), "queues": (" units", True), "index": (" files", False)}


class StageBars:
    """A ``progress(stage, done, total)`` callback that keeps one bar per stage."""

    def __init__(self, *, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.bars: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        bar = self.bars.get(stage)
        if bar is None:
            unit, scale = _UNITS.get(stage, ("", False))
            bar = self.bars[stage] = tqdm(total=total, desc=f"{stage:<6}", unit=unit, unit_scale=scale,
                                          file=sys.stderr, dynamic_ncols=True)
        bar.total = total
        bar.update(done - bar.n)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()

    def __enter__(self) -> StageBars:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
