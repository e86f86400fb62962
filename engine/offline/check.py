"""``check_store``: verify a store offline, every structure against the CommitLog.

* every record in the log passes its checks (length, magic, body CRC, record
  CRC, physical offset); damaged ranges are findings;
* every ConsumeQueue unit points at an intact record of its topic and queue
  whose QUEUEOFFSET is the unit's position and whose size matches; every
  record whose queue offset is below its queue's max has exactly that unit;
* every IndexFile item points at a record that carries a key with its hash;
* the checkpoint's offsets are not ahead of the log;
* the pop groups' journals and segments are intact and agree (``check_pop.py``);
* the timer's log, wheel and checkpoint, and the transaction checkpoint, agree with the
  log (``check_timer.py``).

Records of a deleted topic below its deletion offset (``deleted_topics.py``)
belong to no queue, and a queue left from before its topic's deletion is
not checked (its owner removes it when it starts).

Memory does not grow with the store: the log is read once, and each intact
record's unit is looked up at once (random access into the queue's mapped
file); then each queue's units are read in order and each IndexFile is
mapped, not read. What stays in memory is per queue (the open queue, and
whether it was reported missing) plus the findings, of which at most
``check_memory_bytes_max / 1 KiB`` are kept (the rest are counted in a last
finding). A store 100 times that limit is checked within it
(``tests/unit/test_check_bounded_memory.py``).

Run it on a stopped engine's directory (``python -m engine check``); every
crash test ends with it. On a live store the CLI warns that what it reads is a
moment's (``store_dir.py``). The log is read to each segment's data end only
(``log_scan.py``): the zeros of a sparse segment past the log are not read.
It never writes. ``progress(stage, done, total)`` is called as it goes (the CLI draws a bar from it on a terminal).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.config import StoreConfig
from engine.layout import (
    INDEX_HEADER,
    INDEX_ITEM,
    INDEX_SLOT,
    RecordError,
    RecordHead,
    index_file_bytes,
    index_key_hash,
)
from engine.names import is_decimal
from engine.offline.check_pop import check_pop_state
from engine.offline.check_timer import check_timer_state
from engine.offline.inspect_store import detect_config
from engine.offline.log_scan import scan_log
from engine.store.checkpoint import CheckpointError, load_checkpoint
from engine.store.commit_log import CommitLogReader, Damage
from engine.store.consume_queue import ConsumeQueue, list_queues
from engine.store.deleted_topics import DeletedTopics
from engine.store.epoch_file import EPOCH_FILE, epoch_problems
from engine.store.index_file import INDEX_DIR

FINDING_BYTES = 1024  # what one kept finding is taken to cost, for check_memory_bytes_max
Progress = Callable[[str, int, int], None]  # (stage, done, total): "log" in bytes, "queues" in units, "index" in files
RecordHeads = Iterable[tuple[str, int, int, int]]  # (topic, queue id, queue offset, commit log offset)


def _quiet(_stage: str, _done: int, _total: int) -> None:
    pass


@dataclass(frozen=True)
class Finding:
    area: str  # commitlog, consumequeue, index, checkpoint, pop, timer, epochs
    where: str
    problem: str

    def __str__(self) -> str:
        return f"{self.area} {self.where}: {self.problem}"


class Findings(list[Finding]):
    """The findings kept (at most ``kept_max``) and a count of those that were not."""

    def __init__(self, kept_max: int) -> None:
        super().__init__()
        self.kept_max = max(1, kept_max)
        self.dropped = 0

    def add(self, finding: Finding) -> None:
        if len(self) < self.kept_max:
            self.append(finding)
        else:
            self.dropped += 1

    def closed(self) -> list[Finding]:
        if not self.dropped:
            return list(self)
        return [*self, Finding("check", "findings", f"{self.dropped} more findings not listed "
                                                    f"(check_memory_bytes_max keeps {self.kept_max})")]


def check_store(store_dir: Path, config: StoreConfig | None = None, *, progress: Progress = _quiet) -> list[Finding]:
    config = detect_config(store_dir, config or StoreConfig())
    reader = CommitLogReader.for_config(store_dir, config)
    deleted = DeletedTopics(store_dir)
    findings = Findings(config.check_memory_bytes_max // FINDING_BYTES)
    queues = {key: ConsumeQueue(store_dir, *key, file_units=config.consume_queue_file_units, writable=False)
              for key in list_queues(store_dir)}
    try:
        for key, cq in list(queues.items()):
            if deleted.is_leftover(cq):
                cq.close()
                del queues[key]
        units = UnitCheck(queues, findings)
        log_end = _check_log(reader, config, findings, units, deleted, progress)
        check_units(reader, queues, log_end, findings, progress)
        _check_index(store_dir, reader, config, log_end, findings, progress)
        for finding in check_checkpoint(store_dir, log_end):
            findings.add(finding)
        for where, problem in check_pop_state(store_dir, queues, deleted.deletion_offsets):
            findings.add(Finding("pop", where, problem))
        for where, problem in check_timer_state(store_dir, config, reader, log_end):
            findings.add(Finding("timer", where, problem))
        for problem in epoch_problems(store_dir, log_end):
            findings.add(Finding("epochs", EPOCH_FILE, problem))
        return findings.closed()
    finally:
        for cq in queues.values():
            cq.close()
        reader.segments.close()


def _check_log(reader: CommitLogReader, config: StoreConfig, findings: Findings, units: UnitCheck,
               deleted: DeletedTopics, progress: Progress) -> int:
    """Every record's checks, and its unit looked up at once; returns the end of the last record."""
    first, last = reader.segments.first_offset(), reader.segments.last_offset()
    if first is None or last is None:
        return 0
    end = last + config.segment_size_bytes
    pending: list[Damage] = []  # damage after the last record so far (at most 64 kept)
    pending_more = 0  # ranges past the 64 kept in ``pending``
    log_end = first
    reported = first
    for item in scan_log(reader, heads=True):  # every check, each segment up to its data end; no properties
        if isinstance(item, Damage):
            if len(pending) < 64:
                pending.append(item)
            else:
                pending_more += 1
            continue
        for damage in pending:
            findings.add(Finding("commitlog", f"[{damage.start}, {damage.end})", damage.reason))
        if pending_more:
            findings.add(Finding("commitlog", f"[{pending[-1].end}, {item.commit_log_offset})",
                                 f"{pending_more} more damaged ranges"))
        pending, pending_more = [], 0
        assert isinstance(item, RecordHead)
        if not deleted.hides(item.topic, item.commit_log_offset):
            units.record(item.topic, item.queue_id, item.queue_offset, item.commit_log_offset)
        log_end = item.commit_log_offset + item.total_size
        if log_end - reported >= 1 << 24:
            reported = log_end
            progress("log", log_end - first, end - first)
    progress("log", end - first, end - first)
    # The walk stops at each segment's last non-zero byte: damage after the last record holds bytes.
    for damage in pending:
        findings.add(Finding("commitlog", f"[{damage.start}, {damage.end})",
                             f"{damage.reason} (non-zero bytes after the last record)"))
    if pending_more:
        findings.add(Finding("commitlog", f"[{pending[-1].end}, ...)", f"{pending_more} more damaged ranges"))
    return reader.past_blank_marker(log_end)


class UnitCheck:
    """A record's side of the queue check: the unit at its queue offset must point back at it."""

    def __init__(self, queues: dict[tuple[str, int], ConsumeQueue], findings: Findings | list[Finding]) -> None:
        self.queues = queues
        self.findings = findings
        self.missing: set[tuple[str, int]] = set()  # queues reported missing: one finding each

    def record(self, topic: str, queue_id: int, queue_offset: int, offset: int) -> None:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            if (topic, queue_id) not in self.missing:
                self.missing.add((topic, queue_id))
                _add(self.findings, Finding("consumequeue", f"{topic}/{queue_id}",
                                            f"missing, but the log holds its records (first at {offset})"))
            return
        if not cq.min_offset <= queue_offset < cq.max_offset:
            return  # not dispatched yet (or retention moved the queue's min)
        unit = cq.get(queue_offset)
        if unit is not None and not unit.is_blank and unit.commit_log_offset != offset:
            _add(self.findings, Finding("consumequeue", f"{topic}/{queue_id}@{queue_offset}",
                                        f"record at {offset} is not the one its unit points at "
                                        f"({unit.commit_log_offset})"))


def _add(findings: Findings | list[Finding], finding: Finding) -> None:
    if isinstance(findings, Findings):
        findings.add(finding)
    else:
        findings.append(finding)


def check_units(reader: CommitLogReader, queues: dict[tuple[str, int], ConsumeQueue], log_end: int,
                findings: Findings | list[Finding], progress: Progress = _quiet) -> None:
    """The unit's side: every unit points at an intact record of its queue, at its offset, of its size."""
    log_min = reader.min_offset()
    total = sum(cq.max_offset - cq.min_offset for cq in queues.values())
    done = 0
    for (topic, queue_id), cq in queues.items():
        for queue_offset in range(cq.min_offset, cq.max_offset):
            unit = cq.get(queue_offset)
            where = f"{topic}/{queue_id}@{queue_offset}"
            if unit is None or unit.is_blank:
                _add(findings, Finding("consumequeue", where, "hole (blank unit): its record was damaged"))
                continue
            if unit.commit_log_offset < log_min:
                continue  # the record's segment was removed by retention
            try:
                record = reader.read_head(unit.commit_log_offset, limit=log_end)
            except RecordError as exc:
                _add(findings, Finding("consumequeue", where, f"points at {unit.commit_log_offset}: {exc.reason}"))
                continue
            if (record.topic, record.queue_id, record.queue_offset, record.total_size) != \
                    (topic, queue_id, queue_offset, unit.size):
                _add(findings, Finding("consumequeue", where, f"points at a record of {record.topic}/"
                                       f"{record.queue_id}@{record.queue_offset} (size {record.total_size})"))
        done += cq.max_offset - cq.min_offset
        progress("queues", done, total)


def check_queues(reader: CommitLogReader, queues: dict[tuple[str, int], ConsumeQueue],
                 records: RecordHeads, log_end: int) -> list[Finding]:
    """Both sides for the given queues and records (one queue's, in a Spark task)."""
    findings: list[Finding] = []
    check_units(reader, queues, log_end, findings)
    units = UnitCheck(queues, findings)
    for topic, queue_id, queue_offset, offset in records:
        units.record(topic, queue_id, queue_offset, offset)
    return findings


def _check_index(store_dir: Path, reader: CommitLogReader, config: StoreConfig, log_end: int,
                 findings: Findings, progress: Progress) -> None:
    directory = store_dir / INDEX_DIR
    if not directory.is_dir():
        return
    names = sorted(n for n in os.listdir(directory) if is_decimal(n))
    for done, name in enumerate(names, start=1):
        with open(directory / name, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                found = check_index_file(name, b"", reader, config, log_end)
            else:
                with mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as data:
                    found = check_index_file(name, data, reader, config, log_end)
        for finding in found:
            findings.add(finding)
        progress("index", done, len(names))


def check_index_file(name: str, data: bytes | mmap.mmap, reader: CommitLogReader, config: StoreConfig,
                     log_end: int) -> list[Finding]:
    """One IndexFile's items against the log (files can be checked in parallel)."""
    if len(data) != index_file_bytes(hash_slot_count=config.index_hash_slot_count,
                                     index_count=config.index_item_count_max):
        return [Finding("index", name, f"{len(data)} bytes do not match the configured slot and item "
                                       f"counts; give the store's config")]
    *_, count = INDEX_HEADER.unpack_from(data, 0)
    findings = []
    if not 0 <= count <= config.index_item_count_max:  # a damaged header: walk what the file can hold
        findings.append(Finding("index", name, f"the header counts {count} items; the file holds "
                                               f"{config.index_item_count_max}"))
        count = min(max(count, 0), config.index_item_count_max)
    log_min = reader.min_offset()
    base = INDEX_HEADER.size + config.index_hash_slot_count * INDEX_SLOT.size
    for item in range(1, max(count, 1)):
        key_hash, offset, _diff, prev = INDEX_ITEM.unpack_from(data, base + item * INDEX_ITEM.size)
        where = f"{name} item {item}"
        if prev < 0 or prev >= item:
            findings.append(Finding("index", where, f"chain points forward ({prev})"))
        if offset < log_min:
            continue
        try:
            record = reader.read_view(offset, limit=log_end, check_crc=False)
        except RecordError as exc:
            findings.append(Finding("index", where, f"points at {offset}: {exc.reason}"))
            continue
        keys = [*record["keys"], *([record["uniq_key"]] if record["uniq_key"] else [])]
        if key_hash not in {index_key_hash(f"{record['topic']}#{k}") for k in keys}:
            findings.append(Finding("index", where, f"the record at {offset} carries no key with this hash"))
    return findings


def check_checkpoint(store_dir: Path, log_end: int) -> list[Finding]:
    try:
        checkpoint = load_checkpoint(store_dir)
    except CheckpointError as exc:
        return [Finding("checkpoint", "checkpoint", str(exc))]
    if checkpoint is None:
        return []
    findings = []
    if checkpoint.flushed_offset > log_end:
        findings.append(Finding("checkpoint", "flushed_offset",
                                f"{checkpoint.flushed_offset} is past the end of the log ({log_end})"))
    if checkpoint.dispatched_offset > log_end:
        findings.append(Finding("checkpoint", "dispatched_offset",
                                f"{checkpoint.dispatched_offset} is past the end of the log ({log_end})"))
    return findings
