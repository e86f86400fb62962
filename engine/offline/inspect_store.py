"""An offline dump of a store directory: segments, records, queues, index, checkpoint.

Reads only; safe on a copy of a store or on a stopped engine's directory.
Sizes are taken from the files themselves (all segments of a log have one
size), so no configuration is needed to read a store.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from engine.config import StoreConfig
from engine.layout import CQ_UNIT_BYTES, INDEX_HEADER, Record
from engine.names import is_decimal
from engine.offline.log_scan import scan_log
from engine.offline.store_settings import settings_for
from engine.services.recovery import plan_commit_log_recovery
from engine.store.checkpoint import CheckpointError, load_checkpoint
from engine.store.commit_log import COMMIT_LOG_DIR, CommitLogReader, Damage
from engine.store.consume_queue import ConsumeQueue, list_queues, queue_dir
from engine.store.index_file import INDEX_DIR
from engine.store.mapped_file import list_files

Progress = Callable[[str, int, int], None]  # (stage, done, total): "log" in bytes
PROGRESS_STEP_BYTES = 16 << 20  # a long read of the log reports this often


def _quiet(_stage: str, _done: int, _total: int) -> None:
    pass


def _file_size(files: list[tuple[int, Path]]) -> int | None:
    return files[0][1].stat().st_size if files else None


def detect_config(store_dir: Path, config: StoreConfig, *, segment_size_bytes: int | None = None) -> StoreConfig:
    """``config`` with the segment and queue file sizes this store was really written with."""
    segment = segment_size_bytes or _file_size(list_files(store_dir / COMMIT_LOG_DIR)) or config.segment_size_bytes
    units = config.consume_queue_file_units
    for topic, queue_id in list_queues(store_dir)[:1]:
        size = _file_size(list_files(queue_dir(store_dir, topic, queue_id)))
        units = size // CQ_UNIT_BYTES if size else units
    body_max = min(config.message_body_bytes_max, segment - 64 * 1024) if segment > 64 * 1024 else 1
    return msgspec.structs.replace(config, segment_size_bytes=segment, consume_queue_file_units=units,
                                   message_body_bytes_max=body_max)


def inspect_store(store_dir: Path, *, segment_size_bytes: int | None = None, records_max: int = 20,
                  config_path: Path | None = None, progress: Progress = _quiet) -> dict[str, Any]:
    """``progress("log", bytes read, bytes to read)`` is called as the log is read (a bar on a terminal)."""
    config = detect_config(store_dir, settings_for(store_dir, config_path), segment_size_bytes=segment_size_bytes)
    segments = list_files(store_dir / COMMIT_LOG_DIR)
    size = config.segment_size_bytes
    report: dict[str, Any] = {"store_dir": str(store_dir), "segment_size_bytes": size,
                              "abort_marker": (store_dir / "abort").exists(),
                              "segments": [{"name": p.name, "start_offset": o, "bytes": p.stat().st_size}
                                           for o, p in segments]}
    report["records"], report["damage"] = _records(store_dir, config, records_max, segments, progress)
    report["queues"] = _queues(store_dir, config)
    report["index_files"] = _index_files(store_dir)
    try:
        checkpoint = load_checkpoint(store_dir)
        report["checkpoint"] = dataclasses.asdict(checkpoint) if checkpoint else None
    except CheckpointError as exc:
        report["checkpoint"] = {"error": str(exc)}
    if segments:
        plan = plan_commit_log_recovery(store_dir, config)
        report["recovery_plan"] = {"scan_start": plan.scan_start, "end_offset": plan.end_offset,
                                   "records_scanned": plan.records_scanned, "damaged_ranges": len(plan.damage)}
    return report


def _records(store_dir: Path, config: StoreConfig, records_max: int, segments: list[tuple[int, Path]],
             progress: Progress) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if not segments:
        return [], []
    reader = CommitLogReader.for_config(store_dir, config)
    records: list[dict[str, Any]] = []
    damage: list[dict[str, Any]] = []
    first, end = segments[0][0], segments[-1][0] + config.segment_size_bytes
    next_report = first
    try:
        for item in scan_log(reader, check_crc=True):  # each segment up to its data end
            if isinstance(item, Damage):
                damage.append({"start": item.start, "end": item.end, "reason": item.reason})
                continue
            assert isinstance(item, Record)
            if item.commit_log_offset >= next_report:
                progress("log", item.commit_log_offset - first, end - first)
                next_report = item.commit_log_offset + PROGRESS_STEP_BYTES
            if len(records) < records_max:
                records.append({"commit_log_offset": item.commit_log_offset, "size": item.total_size,
                                "topic": item.topic, "queue_id": item.queue_id, "queue_offset": item.queue_offset,
                                "store_timestamp": item.store_timestamp_ms, "tags": item.tags, "keys": item.keys,
                                "body_bytes": len(item.body), "msg_id": item.msg_id})
    finally:
        reader.segments.close()
    progress("log", end - first, end - first)
    return records, damage


def _queues(store_dir: Path, config: StoreConfig) -> list[dict[str, Any]]:
    queues = []
    for topic, queue_id in list_queues(store_dir):
        files = list_files(queue_dir(store_dir, topic, queue_id))
        units = (_file_size(files) or config.consume_queue_file_bytes) // CQ_UNIT_BYTES
        cq = ConsumeQueue(store_dir, topic, queue_id, file_units=units, writable=False)
        last = cq.get(cq.max_offset - 1)
        queues.append({"topic": topic, "queue_id": queue_id, "min_offset": cq.min_offset,
                       "max_offset": cq.max_offset, "files": len(files),
                       "last_unit": last._asdict() if last else None})
        cq.close()
    return queues


def _index_files(store_dir: Path) -> list[dict[str, Any]]:
    directory = store_dir / INDEX_DIR
    if not directory.is_dir():
        return []
    found = []
    for name in sorted(n for n in os.listdir(directory) if is_decimal(n)):
        with open(directory / name, "rb") as f:
            fields = INDEX_HEADER.unpack(f.read(INDEX_HEADER.size))
        found.append(dict(zip(("begin_timestamp", "end_timestamp", "begin_phy_offset", "end_phy_offset",
                               "hash_slot_count", "index_count"), fields, strict=True), name=name))
    return found


def render(report: dict[str, Any]) -> str:
    lines = [f"store {report['store_dir']} (segment {report['segment_size_bytes']} bytes, "
             f"abort marker {'present' if report['abort_marker'] else 'absent'})", "segments:"]
    lines += [f"  {s['name']}  {s['bytes']} bytes" for s in report["segments"]]
    lines.append(f"records (first {len(report['records'])}):")
    lines += [f"  @{r['commit_log_offset']} size={r['size']} {r['topic']}/{r['queue_id']}#{r['queue_offset']} "
              f"tags={r['tags']} keys={','.join(r['keys'])} body={r['body_bytes']}B id={r['msg_id']}"
              for r in report["records"]]
    lines += [f"  DAMAGE [{d['start']}, {d['end']}): {d['reason']}" for d in report["damage"]]
    lines.append("consume queues:")
    lines += [f"  {q['topic']}/{q['queue_id']} offsets {q['min_offset']}..{q['max_offset']} files={q['files']}"
              for q in report["queues"]]
    lines.append("index files:")
    lines += [f"  {i['name']} items={i['index_count'] - 1} slots_used={i['hash_slot_count']} "
              f"phy {i['begin_phy_offset']}..{i['end_phy_offset']}" for i in report["index_files"]]
    lines.append(f"checkpoint: {report['checkpoint']}")
    if "recovery_plan" in report:
        lines.append(f"recovery plan: {report['recovery_plan']}")
    return "\n".join(lines)
