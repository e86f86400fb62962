"""Retention decisions on a full disk, and the count a forced deletion logs."""

from __future__ import annotations

import os

import pytest

from engine.config import StoreConfig
from engine.services.writer.retention import SegmentFact, plan_deletions, summarize_segment
from engine.store.commit_log import COMMIT_LOG_DIR
from tests.unit.test_commit_log_files import SEG, build_log

pytestmark = pytest.mark.timeout(30)

NOW_S = 1_800_000_000.0
FRESH = [SegmentFact(i * SEG, NOW_S - 60) for i in range(5)]  # written a minute ago: not expired


def config(**changes: object) -> StoreConfig:
    return StoreConfig.test_min().replace(segment_size_bytes=SEG, message_body_bytes_max=1024, **changes)


def test_a_full_disk_keeps_unexpired_segments_and_refuses_sends_by_default() -> None:
    decision = plan_deletions(config(), FRESH, active_start=4 * SEG, now_s=NOW_S, used_ratio=0.99)
    assert decision.delete == []
    assert decision.refuse_sends


def test_forced_deletion_is_an_explicit_setting_and_says_which_segments_were_unexpired() -> None:
    facts = [SegmentFact(0, NOW_S - 100 * 3600), *FRESH[1:]]  # the oldest one expired
    decision = plan_deletions(config(disk_space_clean_forcibly=True), facts, active_start=4 * SEG, now_s=NOW_S,
                              used_ratio=0.87)
    assert decision.delete == [0, SEG, 2 * SEG, 3 * SEG]
    assert decision.forced == {SEG, 2 * SEG, 3 * SEG}
    assert not decision.refuse_sends


def test_expired_segments_still_go_under_disk_pressure() -> None:
    facts = [SegmentFact(0, NOW_S - 100 * 3600), *FRESH[1:]]
    decision = plan_deletions(config(), facts, active_start=4 * SEG, now_s=NOW_S, used_ratio=0.8)
    assert decision.delete == [0]
    assert decision.forced == frozenset()


def test_summary_counts_every_record_of_a_segment_with_its_times(tmp_path) -> None:
    log = build_log(tmp_path, min_segments=3)
    log.writer.close()
    for start in (0, SEG):
        expected = [r for r in log.records if start <= r.offset < start + SEG]
        fd = os.open(tmp_path / COMMIT_LOG_DIR / f"{start:020d}", os.O_RDONLY)
        try:
            summary = summarize_segment(fd, start)
        finally:
            os.close(fd)
        assert summary.messages == len(expected)
        assert (summary.first_store_timestamp_ms, summary.last_store_timestamp_ms) == \
            (expected[0].store_ts, expected[-1].store_ts)
        assert summary.complete
