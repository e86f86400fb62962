"""``check_store``: verify a store offline, every structure against the CommitLog.

* every record in the log passes its checks (length, magic, body CRC, record
  CRC, physical offset); damaged ranges are findings;
* every ConsumeQueue unit points at an intact record of its topic and queue
  whose QUEUEOFFSET is the unit's position and whose size matches; every
  record whose queue offset is below its queue's max has exactly that unit;
* every IndexFile item points at a record that carries a key with its hash;
* the checkpoint's offsets are not ahead of the log.

Records of a deleted topic below its deletion offset (``deleted_topics.py``)
belong to no queue, and a queue left from before its topic's deletion is
not checked (its owner removes it when it starts).

Run it on a stopped engine's directory (``python -m engine check``); every
crash test ends with it. It never writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.checkpoint import CheckpointError, load_checkpoint
from engine.commit_log import CommitLogReader, Damage
from engine.config import StoreConfig
from engine.consume_queue import ConsumeQueue, list_queues
from engine.deleted_topics import DeletedTopics
from engine.index_file import INDEX_DIR
from engine.inspect_store import detect_config
from engine.layout import INDEX_HEADER, INDEX_ITEM, INDEX_SLOT, RecordError, index_file_bytes, index_key_hash


@dataclass(frozen=True)
class Finding:
    area: str  # commitlog, consumequeue, index, checkpoint
    where: str
    problem: str

    def __str__(self) -> str:
        return f"{self.area} {self.where}: {self.problem}"


def check_store(store_dir: Path, config: StoreConfig | None = None) -> list[Finding]:
    config = detect_config(store_dir, config or StoreConfig())
    reader = CommitLogReader.for_config(store_dir, config)
    try:
        findings, log_end, records = _check_log(reader, config)
        deleted = DeletedTopics(store_dir)
        records = [r for r in records if not deleted.hides(r[0], r[3])]
        queues = {key: ConsumeQueue(store_dir, *key, file_units=config.consume_queue_file_units, writable=False)
                  for key in list_queues(store_dir)}
        for key, cq in list(queues.items()):
            if deleted.is_leftover(cq):
                cq.close()
                del queues[key]
        try:
            findings += check_queues(reader, queues, records, log_end)
        finally:
            for cq in queues.values():
                cq.close()
        findings += _check_index(store_dir, reader, config, log_end)
        findings += check_checkpoint(store_dir, log_end)
        return findings
    finally:
        reader.segments.close()


def _check_log(reader: CommitLogReader, config: StoreConfig) -> tuple[list[Finding], int, list[tuple]]:
    first, last = reader.segments.first_offset(), reader.segments.last_offset()
    if first is None or last is None:
        return [], 0, []
    findings: list[Finding] = []
    records: list[tuple[str, int, int, int]] = []
    pending: list[Damage] = []
    log_end = first
    for item in reader.scan(first, last + config.segment_size_bytes, check_crc=True):
        if isinstance(item, Damage):
            pending.append(item)
            continue
        findings += [Finding("commitlog", f"[{d.start}, {d.end})", d.reason) for d in pending]
        pending = []
        records.append((item.topic, item.queue_id, item.queue_offset, item.commit_log_offset))
        log_end = item.commit_log_offset + item.total_size
    # Damage after the last record is the unwritten rest of the log unless it holds bytes.
    for damage in pending:
        segment = reader.segment_at(damage.start)
        if segment is not None and segment.mm[damage.start - segment.start_offset:
                                              damage.end - segment.start_offset].strip(b"\x00"):
            findings.append(Finding("commitlog", f"[{damage.start}, {damage.end})",
                                    f"{damage.reason} (non-zero bytes after the last record)"))
    return findings, log_end, records


def check_queues(reader: CommitLogReader, queues: dict[tuple[str, int], ConsumeQueue],
                  records: list[tuple[str, int, int, int]], log_end: int) -> list[Finding]:
    findings = []
    log_min = reader.min_offset()
    for (topic, queue_id), cq in queues.items():
        for queue_offset in range(cq.min_offset, cq.max_offset):
            unit = cq.get(queue_offset)
            where = f"{topic}/{queue_id}@{queue_offset}"
            if unit is None or unit.is_blank:
                findings.append(Finding("consumequeue", where, "hole (blank unit): its record was damaged"))
                continue
            if unit.commit_log_offset < log_min:
                continue  # the record's segment was removed by retention
            try:
                record = reader.read(unit.commit_log_offset, limit=log_end, check_crc=True)
            except RecordError as exc:
                findings.append(Finding("consumequeue", where, f"points at {unit.commit_log_offset}: {exc.reason}"))
                continue
            if (record.topic, record.queue_id, record.queue_offset, record.total_size) != \
                    (topic, queue_id, queue_offset, unit.size):
                findings.append(Finding("consumequeue", where, f"points at a record of {record.topic}/"
                                        f"{record.queue_id}@{record.queue_offset} (size {record.total_size})"))
    missing: set[tuple[str, int]] = set()
    for topic, queue_id, queue_offset, offset in records:
        cq = queues.get((topic, queue_id))
        if cq is None:
            if (topic, queue_id) not in missing:
                missing.add((topic, queue_id))
                findings.append(Finding("consumequeue", f"{topic}/{queue_id}",
                                        f"missing, but the log holds its records (first at {offset})"))
            continue
        if not cq.min_offset <= queue_offset < cq.max_offset:
            continue  # not dispatched yet (or retention moved the queue's min)
        unit = cq.get(queue_offset)
        if unit is not None and not unit.is_blank and unit.commit_log_offset != offset:
            findings.append(Finding("consumequeue", f"{topic}/{queue_id}@{queue_offset}",
                                    f"record at {offset} is not the one its unit points at ({unit.commit_log_offset})"))
    return findings


def _check_index(store_dir: Path, reader: CommitLogReader, config: StoreConfig, log_end: int) -> list[Finding]:
    directory = store_dir / INDEX_DIR
    if not directory.is_dir():
        return []
    findings = []
    for name in sorted(n for n in os.listdir(directory) if n.isdigit()):
        findings += check_index_file(name, (directory / name).read_bytes(), reader, config, log_end)
    return findings


def check_index_file(name: str, data: bytes, reader: CommitLogReader, config: StoreConfig,
                     log_end: int) -> list[Finding]:
    """One IndexFile's items against the log (files can be checked in parallel)."""
    *_, count = INDEX_HEADER.unpack_from(data, 0)
    if len(data) != index_file_bytes(hash_slot_count=config.index_hash_slot_count,
                                     index_count=config.index_item_count_max):
        return [Finding("index", name, f"{len(data)} bytes do not match the configured slot and item "
                                       f"counts; give the store's config")]
    findings = []
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
            record = reader.read(offset, limit=log_end, check_crc=False)
        except RecordError as exc:
            findings.append(Finding("index", where, f"points at {offset}: {exc.reason}"))
            continue
        keys = [*record.keys, *([record.uniq_key] if record.uniq_key else [])]
        if key_hash not in {index_key_hash(f"{record.topic}#{k}") for k in keys}:
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
