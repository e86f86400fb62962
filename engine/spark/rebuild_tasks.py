"""The rebuild job's executor side: per queue, per index file, with the engine's own code.

* ``queue_task``: rows of one or more queues, sorted by queue then log
  offset, become ConsumeQueue files through ``ConsumeQueue.put`` (the call
  the engine's owners and ``repair`` make), are checked with the engine's
  ``check.check_queues`` against the queue on disk, and are compared
  byte for byte with the files on disk.
* ``index_task``: items of one or more index files, sorted by file then
  ordinal, become IndexFiles through ``IndexFile.put_key``. File n holds
  items [n * (count_max - 1), (n + 1) * (count_max - 1)) and starts from the
  last item of file n - 1, exactly as ``IndexService`` rolls its files.
* ``check_index_file``: ``check._check_index`` for one file.

Every task returns result rows (``ResultRow``): findings (as
``engine.offline.check.Finding``), differences from the files on disk, or counts.
The queue and index tasks run as Spark write tasks of the internal sink in
``task_sink`` (a Python data source writer gets its partition as Arrow
batches without needing pandas, unlike ``mapInArrow``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from engine.config import StoreConfig
from engine.offline.check import Finding, check_queues
from engine.offline.check import check_index_file as check_one_index_file
from engine.store.commit_log import CommitLogReader
from engine.store.consume_queue import ConsumeQueue, queue_dir
from engine.store.index_file import INDEX_DIR, IndexFile
from engine.store.mapped_file import list_files

FINDING, DIFFERENCE, BUILT = "finding", "difference", "built"
ResultRow = tuple[str, str, str, str]  # kind, area, where, problem (for BUILT: a count)


@dataclass(frozen=True)
class JobContext:
    """What every task needs: picklable names and numbers."""

    store_dir: str
    output_dir: str
    config: StoreConfig
    log_end: int


def _finding_row(finding: Finding) -> ResultRow:
    return FINDING, finding.area, finding.where, finding.problem


def queue_task(context: JobContext, batches: Iterator[pa.RecordBatch]) -> list[ResultRow]:
    """Rows (topic, queue_id, queue_offset, commit_log_offset, size, tags_code, on_disk), sorted by
    queue then log offset -> result rows."""
    reader = CommitLogReader.for_config(Path(context.store_dir), context.config)
    results: list[ResultRow] = []
    key: tuple[str, int] | None = None
    records: list[tuple[int, int, int, int]] = []
    on_disk = False
    try:
        for batch in batches:
            for row in batch.to_pylist():
                row_key = (row["topic"], row["queue_id"])
                if row_key != key:
                    if key is not None:
                        results += _one_queue(context, reader, key, records, on_disk=on_disk)
                    key, records, on_disk = row_key, [], False
                if row["on_disk"]:
                    on_disk = True
                else:
                    records.append((row["queue_offset"], row["commit_log_offset"], row["size"], row["tags_code"]))
        if key is not None:
            results += _one_queue(context, reader, key, records, on_disk=on_disk)
        return results
    finally:
        reader.segments.close()


def _one_queue(context: JobContext, reader: CommitLogReader, key: tuple[str, int],
               records: list[tuple[int, int, int, int]], *, on_disk: bool) -> list[ResultRow]:
    topic, queue_id = key
    units = context.config.consume_queue_file_units
    rebuilt = ConsumeQueue(Path(context.output_dir), topic, queue_id, file_units=units, writable=True)
    try:
        for queue_offset, offset, size, code in records:  # in log order, as the dispatcher applies them
            rebuilt.put(queue_offset, offset, size, code)
        rebuilt.flush()
    finally:
        rebuilt.close()
    disk = ConsumeQueue(Path(context.store_dir), topic, queue_id, file_units=units, writable=False) if on_disk else None
    try:
        heads = [(topic, queue_id, queue_offset, offset) for queue_offset, offset, _size, _code in records]
        findings = check_queues(reader, {key: disk} if disk is not None else {}, heads, context.log_end)
    finally:
        if disk is not None:
            disk.close()
    rows = [_finding_row(f) for f in findings]
    rows += [(DIFFERENCE, "consumequeue", f"{topic}/{queue_id}", d) for d in _compare_queue_files(context, key)]
    rows.append((BUILT, "consumequeue", f"{topic}/{queue_id}", str(len(records))))
    return rows


def _compare_queue_files(context: JobContext, key: tuple[str, int]) -> list[str]:
    ours = dict(list_files(queue_dir(Path(context.output_dir), *key)))
    theirs = dict(list_files(queue_dir(Path(context.store_dir), *key)))
    differences = []
    for start in sorted(set(ours) | set(theirs)):
        name = f"{start:020d}"
        if start not in theirs:
            differences.append(f"{name}: rebuilt, but not on disk")
        elif start not in ours:
            differences.append(f"{name}: on disk, but the log does not make it")
        else:
            at = first_difference(ours[start], theirs[start])
            if at is not None:
                differences.append(f"{name}: differs from the rebuilt file at byte {at} (unit {at // 20})")
    return differences


def first_difference(a: Path, b: Path, chunk_bytes: int = 1 << 20) -> int | None:
    """The first byte offset where two files differ (a length difference counts), None if equal."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        position = 0
        for _ in range(1 << 40):
            left, right = fa.read(chunk_bytes), fb.read(chunk_bytes)
            if left != right:
                return position + next((i for i, (x, y) in enumerate(zip(left, right, strict=False)) if x != y),
                                       min(len(left), len(right)))
            if not left:
                return None
            position += len(left)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class IndexPlan:
    """Names and starting points of the index files the job writes."""

    names: dict[int, str]  # file number -> file name
    previous: dict[int, tuple[int, int]]  # file number -> (commit log offset, store time) of the item before


def index_task(context: JobContext, plan: IndexPlan, batches: Iterator[pa.RecordBatch]) -> list[ResultRow]:
    """Rows (file_no, ordinal, key, commit_log_offset, store_timestamp) sorted by file then ordinal."""
    config = context.config
    directory = Path(context.output_dir) / INDEX_DIR
    directory.mkdir(parents=True, exist_ok=True)
    results: list[ResultRow] = []
    current: IndexFile | None = None
    current_no = -1
    try:
        for batch in batches:
            for row in batch.to_pylist():
                if row["file_no"] != current_no:
                    if current is not None:
                        results.append(_close_index(current, plan, current_no))
                        current = None
                    current_no = row["file_no"]
                    end_offset, end_ms = plan.previous.get(current_no, (0, 0))
                    current = IndexFile.create(directory / plan.names[current_no],
                                               hash_slot_count=config.index_hash_slot_count,
                                               index_count_max=config.index_item_count_max,
                                               end_phy_offset=end_offset, end_timestamp_ms=end_ms)
                assert current is not None
                added = current.put_key(row["key"], row["commit_log_offset"], row["store_timestamp"])
                assert added, f"index file {current_no} is full before item {row['ordinal']}"
        if current is not None:
            results.append(_close_index(current, plan, current_no))
            current = None
        return results
    finally:
        if current is not None:
            current.close()


def _close_index(index: IndexFile, plan: IndexPlan, number: int) -> ResultRow:
    index.flush()
    items = index.index_count - 1
    index.close()
    return BUILT, "index", plan.names[number], str(items)


def check_index_file(context: JobContext, name: str) -> list[ResultRow]:
    """``engine.offline.check``'s check of one IndexFile (so that files are checked in parallel)."""
    data = (Path(context.store_dir) / INDEX_DIR / name).read_bytes()
    reader = CommitLogReader.for_config(Path(context.store_dir), context.config)
    try:
        return [_finding_row(f) for f in check_one_index_file(name, data, reader, context.config, context.log_end)]
    finally:
        reader.segments.close()
