"""The writer's retention rounds: the facts gathered, the plan carried out, what it cost.

Every ``clean_resource_interval_ms`` (and once at recovery) the writer runs a round: the
segments' last-modified times and the disk's use go to ``plan_deletions``
(``engine/services/writer/retention.py``, the decision), and its plan is carried out here: the
segments it names are deleted, oldest first, and sends are refused (DISK_FULL) or taken
again as it says. A segment deleted before it expired (``disk_space_clean_forcibly``) is
logged with what it held, counted in a background thread on a descriptor opened before
the unlink, so the writer's loop does not read a whole segment.

Called by the writer (``engine/actors/commit_log_writer.py``), which publishes the log's new
min offset after a round that deleted segments and lets the deletion table forget what
they held.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engine.config import StoreConfig
from engine.layout import offset_to_file_name
from engine.logs import event
from engine.services.writer.retention import SegmentFact, plan_deletions, summarize_segment
from engine.store.commit_log import CommitLogWriter
from engine.store.disk_space import disk_used_ratio

log = logging.getLogger(__name__)


def _utc(timestamp_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp_ms / 1000)) if timestamp_ms else "-"


class RetentionRounds:
    """Whether sends are refused, the disk's use at the last round, and the rounds' counts."""

    def __init__(self, log: CommitLogWriter, store_dir: Path, config: StoreConfig, *, background: bool) -> None:
        self.log = log
        self.store_dir = store_dir
        self.config = config
        self.background = background  # may the forced deletions be counted in a background thread
        self.refuse_sends = False  # the disk is past disk_space_warning_level_ratio
        self.disk_used_ratio = 0.0  # at the last round
        self.rounds = 0
        self.forced_counter: ThreadPoolExecutor | None = None  # counts what forced deletions took
        self.forced_deleted_segments = 0
        self.forced_deleted_messages = 0

    def round(self, now_s: float) -> list[int]:
        """Delete expired segments (and, with disk_space_clean_forcibly, unexpired ones); the start
        offsets of those deleted. Decides at once whether the disk is too full for sends."""
        self.rounds += 1
        segments = self.log.segments
        segments.refresh()
        facts = []
        for start in segments.known:
            try:
                facts.append(SegmentFact(start, os.stat(segments.directory / offset_to_file_name(start)).st_mtime))
            except FileNotFoundError:
                continue
        active = self.log.written_offset - self.log.written_offset % self.config.segment_size_bytes
        decision = plan_deletions(self.config, facts, active_start=active, now_s=now_s,
                                  used_ratio=disk_used_ratio(self.store_dir))
        if decision.refuse_sends != self.refuse_sends:
            log.warning("disk %.0f %% used: sends are %s", decision.disk_used_ratio * 100,
                        "refused" if decision.refuse_sends else "accepted again",
                        extra=event("disk.full" if decision.refuse_sends else "disk.space_ok",
                                    disk_used_ratio=round(decision.disk_used_ratio, 4)))
        self.refuse_sends = decision.refuse_sends
        self.disk_used_ratio = decision.disk_used_ratio
        for start in decision.delete:
            if start in decision.forced:
                self.count_forced_deletion(start)
            segments.delete(start)
            log.info("retention: deleted segment %s", offset_to_file_name(start))
        return list(decision.delete)

    def count_forced_deletion(self, start: int) -> None:
        """An unexpired segment goes (``disk_space_clean_forcibly``): log and count what it held.

        The count runs in a background thread on a descriptor opened before the unlink."""
        name = offset_to_file_name(start)
        log.warning("retention: the disk is past disk_space_clean_forcibly_ratio: deleting the unexpired "
                    "segment %s; its messages are counted in the background", name)
        fd = os.open(self.log.segments.directory / name, os.O_RDONLY)
        if not self.background:
            self._count_forced(fd, start)
            return
        if self.forced_counter is None:
            self.forced_counter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forced-deletion")
        self.forced_counter.submit(self._count_forced, fd, start)

    def _count_forced(self, fd: int, start: int) -> None:
        try:
            summary = summarize_segment(fd, start)
        finally:
            os.close(fd)
        self.forced_deleted_segments += 1
        self.forced_deleted_messages += summary.messages
        log.warning("retention: deleted unexpired segment %s: %d messages%s, stored from %s to %s",
                    offset_to_file_name(start), summary.messages, "" if summary.complete else " (counted up to "
                    "a damaged record)", _utc(summary.first_store_timestamp_ms), _utc(summary.last_store_timestamp_ms),
                    extra=event("retention.forced_deletion", segment=offset_to_file_name(start),
                                messages=summary.messages))

    def close(self) -> None:
        """Wait for the counts under way."""
        if self.forced_counter is not None:
            self.forced_counter.shutdown(wait=True)
