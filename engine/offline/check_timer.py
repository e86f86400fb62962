"""``check_timer_state``: verify the timer's and the transaction actor's files offline.

* the timer checkpoint (``config/timercheck``) reads, and its log end and queue offset
  are not past the timer log and ``rmq_sys_wheel_timer``;
* every timer-log unit before the checkpoint's log end passes its CRC and names an
  intact record of ``rmq_sys_wheel_timer`` of its size (records retention removed aside);
* every wheel slot not delivered yet heads a list of exactly its count of units, each in
  that slot, none past the log end;
* the transaction checkpoint (``config/transactions.json``) reads, and each undecided
  half it keeps is a record of ``RMQ_SYS_TRANS_HALF_TOPIC``.

Memory is one slot and one unit at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from engine.config import StoreConfig
from engine.layout import RecordError
from engine.store.commit_log import CommitLogReader
from engine.store.system_topics import HALF_TOPIC, TIMER_TOPIC
from engine.store.timer_files import (
    NO_UNIT,
    SLOT,
    TIMER_CHECKPOINT_FILE,
    TIMER_LOG_DIR,
    TIMER_WHEEL_FILE,
    UNIT_BYTES,
    TimerLog,
    load_timer_checkpoint,
)
from engine.store.transaction_state import TRANSACTIONS_FILE, load_transaction_checkpoint

TimerFinding = tuple[str, str]  # where, problem


def check_timer_state(store_dir: Path, config: StoreConfig, reader: CommitLogReader,
                      log_end: int) -> Iterator[TimerFinding]:
    if (store_dir / TIMER_CHECKPOINT_FILE).exists():
        yield from _check_timer(store_dir, config, reader, log_end)
    if (store_dir / TRANSACTIONS_FILE).exists():
        checkpoint = load_transaction_checkpoint(store_dir)
        for half in checkpoint.halves:
            if half.commit_log_offset < reader.min_offset():
                continue
            try:
                record = reader.read(half.commit_log_offset, limit=log_end)
            except RecordError as exc:
                yield TRANSACTIONS_FILE, f"the undecided half at {half.commit_log_offset} cannot be read: {exc.reason}"
                continue
            if record.topic != HALF_TOPIC:
                yield TRANSACTIONS_FILE, f"the undecided half at {half.commit_log_offset} is a record of {record.topic}"


def _check_timer(store_dir: Path, config: StoreConfig, reader: CommitLogReader,
                 log_end: int) -> Iterator[TimerFinding]:
    checkpoint = load_timer_checkpoint(store_dir)
    if checkpoint is None:
        yield TIMER_CHECKPOINT_FILE, "unreadable (and its backup too)"
        return
    timer_log = TimerLog(store_dir, config.timer_log_segment_bytes)
    try:
        for start in timer_log.files.known:  # files whose units were all delivered are gone
            for pos in range(start, min(start + config.timer_log_segment_bytes, checkpoint.log_end), UNIT_BYTES):
                unit = timer_log.read(pos)
                if unit is None:
                    yield TIMER_LOG_DIR, f"the unit at {pos}, before the checkpoint's log end " \
                                         f"{checkpoint.log_end}, is damaged"
                elif unit.offset_py >= reader.min_offset():
                    problem = _source_problem(reader, unit.offset_py, unit.size_py, log_end)
                    if problem:
                        yield TIMER_LOG_DIR, f"the unit at {pos}: {problem}"
        units_end = checkpoint.log_end + UNIT_BYTES * sum(1 for _ in timer_log.units_from(checkpoint.log_end))
        yield from _check_wheel(store_dir, config, timer_log, checkpoint.read_time_ms, units_end)
    finally:
        timer_log.close()


def _source_problem(reader: CommitLogReader, offset: int, size: int, log_end: int) -> str:
    if offset + size > log_end:
        return f"its message at {offset} lies past the log's end {log_end}"
    try:
        record = reader.read(offset, limit=log_end)
    except RecordError as exc:
        return f"its message at {offset} cannot be read: {exc.reason}"
    if record.topic != TIMER_TOPIC or record.total_size != size:
        return f"the record at {offset} is not its message ({record.topic}, {record.total_size} bytes)"
    return ""


def _check_wheel(store_dir: Path, config: StoreConfig, timer_log: TimerLog, read_time_ms: int,
                 units_end: int) -> Iterator[TimerFinding]:
    path = store_dir / TIMER_WHEEL_FILE
    if not path.exists():
        return
    data = path.read_bytes()
    precision = config.timer_precision_ms
    for index, (time_ms, _first, last, count, _magic) in enumerate(SLOT.iter_unpack(data)):
        if count <= 0 or time_ms < read_time_ms:
            continue  # empty, or delivered
        where = f"{TIMER_WHEEL_FILE} slot {index} ({time_ms})"
        if time_ms % precision or (time_ms // precision) % config.timer_wheel_slots != index:
            yield where, "its time does not belong in this slot"
            continue
        pos, seen = last, 0
        while pos != NO_UNIT and seen < count:
            unit = timer_log.read(pos) if pos < units_end else None
            if unit is None:
                yield where, f"its list breaks at {pos} after {seen} of {count} units"
                break
            if unit.deliver_ms - unit.deliver_ms % precision != time_ms:
                yield where, f"the unit at {pos} is due at {unit.deliver_ms}, in another slot"
            pos, seen = unit.prev_pos, seen + 1
