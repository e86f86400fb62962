"""Retention of ConsumeQueue files (``ConsumeQueue.drop_before``): a file goes only when its last
unit says every record it points at is below the log's start."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.store.consume_queue import ConsumeQueue

pytestmark = pytest.mark.timeout(30)
UNITS = 8  # units per file


def _queue(store_dir: Path) -> ConsumeQueue:
    return ConsumeQueue(store_dir, "orders", 0, file_units=UNITS, writable=True)


def _fill(cq: ConsumeQueue, count: int, *, record_bytes: int = 100) -> None:
    for queue_offset in range(count):
        assert cq.put(queue_offset, queue_offset * record_bytes, record_bytes, 0)


def test_a_file_whose_records_are_all_below_the_log_start_goes(tmp_path: Path) -> None:
    cq = _queue(tmp_path)
    _fill(cq, 2 * UNITS + 3)
    assert cq.drop_before(UNITS * 100) == 1  # the first file's records end at 800
    assert cq.min_offset == UNITS and cq.files.known == [UNITS * 20, 2 * UNITS * 20]
    assert cq.drop_before(UNITS * 100 - 1) == 0


def test_a_file_whose_last_units_a_power_cut_lost_stays(tmp_path: Path) -> None:
    """The last units of the first file were never written back (zeros), while the next file's
    were: the blank last unit must not read as "records at offset 0, below any log start"."""
    cq = _queue(tmp_path)
    _fill(cq, 2 * UNITS + 3)
    cq.close()
    first_file = tmp_path / "consumequeue" / "orders" / "0" / f"{0:020d}"
    with first_file.open("r+b") as f:  # units 6 and 7 back to zeros, as a lost page leaves them
        f.seek((UNITS - 2) * 20)
        f.write(bytes(2 * 20))
    cq = _queue(tmp_path)
    assert cq.max_offset == 2 * UNITS + 3
    assert cq.drop_before(0) == 0 and cq.drop_before(150) == 0
    assert cq.files.known[0] == 0, "the first file is kept"
    unit = cq.get(UNITS - 3)
    assert unit is not None and unit.commit_log_offset == (UNITS - 3) * 100, "with its units"
