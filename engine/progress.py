"""Progress bars for what a person waits on at a terminal, drawn by tqdm.

* ``StageBars``: the stages of ``engine check`` (log bytes, queue units, index files), and
  the log read by ``inspect`` and ``check --repair``;
* ``count_bar``: a count of known size, such as ``engine produce --count 100000``;
* ``SparkJobBar``: the tasks of the Spark jobs a driver waits on (``engine/spark``).

Quiet unless stderr is a terminal, and with ``--json`` (callers pass ``enabled=False``):
scripts and pipes see only results.
"""

from __future__ import annotations

import sys
import threading
import uuid
from typing import Any

from tqdm import tqdm

# stage -> (unit, scale with k/M/G prefixes)
_UNITS = {"log": ("B", True), "queues": (" units", True), "index": (" files", False)}
_REFRESH_S = 0.5  # how often a bar that no loop updates is redrawn


def enabled_here(enabled: bool | None) -> bool:
    """``enabled``, or when it is None, whether stderr is a terminal."""
    return sys.stderr.isatty() if enabled is None else enabled


class StageBars:
    """A ``progress(stage, done, total)`` callback that keeps one bar per stage."""

    def __init__(self, *, enabled: bool | None = None) -> None:
        self.enabled = enabled_here(enabled)
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


def count_bar(total: int, *, desc: str, unit: str, enabled: bool | None = None) -> Any:
    """A tqdm bar of ``total`` ``unit``s; ``update(n)`` after each n done, ``close()`` at the end.

    Disabled (every call a no-op, nothing printed) unless ``enabled_here(enabled)``."""
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr, dynamic_ncols=True,
                disable=not enabled_here(enabled))


class SparkJobBar:
    """One bar over the tasks of the Spark jobs that run inside it, read from the driver's status tracker.

    The jobs are found by their job group: the caller's group if it has one (jobs of that
    group from before are left out), else a group of its own, set on this thread for the
    block and removed after. A thread polls the tracker every ``refresh_s``, and once more
    at the end, so jobs shorter than a poll still count. A finished job counts the tasks it
    ran (stages it skipped never run). ``context`` is the ``SparkContext``.
    """

    def __init__(self, context: Any, *, desc: str, enabled: bool | None = None, refresh_s: float = _REFRESH_S) -> None:
        self.context = context
        self.refresh_s = refresh_s
        self.bar = tqdm(total=0, desc=desc, unit=" tasks", file=sys.stderr, dynamic_ncols=True,
                        disable=not enabled_here(enabled))
        self.group = ""
        self.own_group = False
        self.jobs_before: set[int] = set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll_until_done, name="spark-progress", daemon=True)

    def __enter__(self) -> SparkJobBar:
        if self.bar.disable:
            return self
        group = self.context.getLocalProperty("spark.jobGroup.id")
        if group is None:
            group, self.own_group = f"rmqpy-progress-{uuid.uuid4().hex}", True
            self.context.setLocalProperty("spark.jobGroup.id", group)
        self.group = group
        self.jobs_before = set(self.context.statusTracker().getJobIdsForGroup(group))
        self.thread.start()
        return self

    def tasks(self) -> tuple[int, int]:
        """(done, total) tasks of the block's jobs so far."""
        tracker = self.context.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = None if job_id in self.jobs_before else tracker.getJobInfo(job_id)
            if job is None:
                continue
            stages = [tracker.getStageInfo(stage_id) for stage_id in job.stageIds]
            finished = job.status in ("SUCCEEDED", "FAILED")
            for stage in stages:
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numCompletedTasks if finished else stage.numTasks
        return done, total

    def _show(self) -> None:
        done, total = self.tasks()
        self.bar.total = max(total, done)
        self.bar.update(done - self.bar.n)

    def _poll_until_done(self) -> None:
        while not self.done.wait(self.refresh_s):
            self._show()

    def __exit__(self, *exc: object) -> None:
        if self.bar.disable:
            return
        self.done.set()
        self.thread.join()
        self._show()
        self.bar.close()
        if self.own_group:
            self.context.setLocalProperty("spark.jobGroup.id", None)
