"""The store's invariants, checked on the files once the simulated engine has settled.

* ``engine check`` finds nothing: every record intact, every unit and index item
  pointing at its own record, the checkpoint within the log;
* the queues and the index agree with the log: every record of the log has its unit
  (no hole, no duplicate: one unit per queue offset, one record per unit) and every
  key of a record finds it;
* nothing the flush mode promised is lost: every durable send, and under SYNC_FLUSH
  every pulled message, is at its queue offset with its body;
* the engine settled: every receiver applied and flushed the whole log;
* no message was moved out of a system topic twice, and none before its deliver time;
  at the end, every delayed send the flush mode promised is in its queue, once.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from engine.config import StoreConfig
from engine.layout import RecordError
from engine.offline.check import check_store
from engine.store.commit_log import CommitLogReader, Damage
from engine.store.consume_queue import ConsumeQueue, list_queues
from engine.store.deleted_topics import DeletedTopics
from engine.store.index_file import IndexService
from engine.store.system_topics import PROPERTY_TIMER_OUT_MS, SYSTEM_TOPICS, origin_offset
from harness.simulation.workload import TIMER_TOPIC, TRANSACTION_TOPIC, Workload

_TIME_MAX_MS = 1 << 62


def violations(store_dir: Path, config: StoreConfig, workload: Workload, log_end: int, *,
               client: bool = True) -> list[str]:
    """What the store breaks, and (``client``) what the client saw break."""
    found = [f"check: {f.area} {f.where}: {f.problem}" for f in check_store(store_dir, config)]
    reader = CommitLogReader.for_config(store_dir, config)
    queues = {key: ConsumeQueue(store_dir, *key, file_units=config.consume_queue_file_units, writable=False)
              for key in list_queues(store_dir)}
    index = IndexService(store_dir, hash_slot_count=config.index_hash_slot_count,
                         index_count_max=config.index_item_count_max, writable=False)
    try:
        found += _agreement(reader, queues, index, log_end)
        found += _promises(reader, queues, workload, log_end)
        found += _moves(reader, log_end)
    finally:
        for cq in queues.values():
            cq.close()
        index.close()
        reader.segments.close()
    return found + (workload.violations if client else [])


def _agreement(reader: CommitLogReader, queues: dict[tuple[str, int], ConsumeQueue], index: IndexService,
               log_end: int) -> list[str]:
    found = []
    next_offset: dict[tuple[str, int], int] = {}
    deleted = DeletedTopics(reader.segments.directory.parent)
    for item in reader.scan(reader.min_offset(), log_end, check_crc=True):
        if isinstance(item, Damage):
            found.append(f"log: damage in [{item.start}, {item.end}): {item.reason}")
            continue
        if deleted.hides(item.topic, item.commit_log_offset):
            continue  # a deleted topic's record: in no queue, found by no key
        key = (item.topic, item.queue_id)
        expected = next_offset.get(key, item.queue_offset)
        if item.queue_offset != expected:
            found.append(f"log: {key} jumps from queue offset {expected} to {item.queue_offset}")
        next_offset[key] = item.queue_offset + 1
        cq = queues.get(key)
        unit = cq.get(item.queue_offset) if cq is not None else None
        if unit is None or unit.commit_log_offset != item.commit_log_offset:
            found.append(f"queue {key}@{item.queue_offset}: no unit for the record at {item.commit_log_offset}")
        for user_key in item.keys:
            if item.commit_log_offset not in index.query(item.topic, user_key, count_max=64, begin_ms=0,
                                                         end_ms=_TIME_MAX_MS):
                found.append(f"index: key {user_key!r} does not find the record at {item.commit_log_offset}")
    for key, cq in queues.items():
        if cq.max_offset > next_offset.get(key, 0):
            found.append(f"queue {key}: units up to {cq.max_offset}, records only up to {next_offset.get(key, 0)}")
    return found


def _promises(reader: CommitLogReader, queues: dict[tuple[str, int], ConsumeQueue], workload: Workload,
              log_end: int) -> list[str]:
    found = []
    expected = {position: stored.body for position, stored in workload.durable.items()}
    if workload.sync_flush:
        expected.update(workload.seen)
    for (topic, queue_id, queue_offset), body in sorted(expected.items()):
        cq = queues.get((topic, queue_id))
        unit = cq.get(queue_offset) if cq is not None else None
        if unit is None:
            found.append(f"lost: {topic}/{queue_id}@{queue_offset} was promised and has no unit")
            continue
        try:
            record = reader.read(unit.commit_log_offset, limit=log_end)
        except RecordError as exc:
            found.append(f"lost: {topic}/{queue_id}@{queue_offset}: {exc.reason}")
            continue
        if bytes(record.body) != body:
            found.append(f"lost: {topic}/{queue_id}@{queue_offset} holds another message")
    return found


def _moves(reader: CommitLogReader, log_end: int) -> list[str]:
    """Each system-topic record moved at most once, and a delayed one not before its time."""
    found, moved = [], set()
    for item in reader.scan(reader.min_offset(), log_end):
        if isinstance(item, Damage) or item.topic in SYSTEM_TOPICS:
            continue
        origin = origin_offset(item)
        if origin is None:
            continue
        if origin in moved:
            found.append(f"moves: the record at {origin} was moved twice (again at {item.commit_log_offset})")
        moved.add(origin)
        try:
            source = reader.read(origin, limit=log_end)
        except RecordError:
            continue  # under retention, or taken by a power cut with the move kept: not judged here
        due = source.properties.get(PROPERTY_TIMER_OUT_MS)
        if due is not None and item.store_timestamp_ms < int(due):
            found.append(f"moves: the record at {origin} was delivered at {item.store_timestamp_ms}, "
                         f"before its time {due}")
    return found


def delayed_arrivals(store_dir: Path, config: StoreConfig, workload: Workload) -> list[str]:
    """Every delayed send the flush mode promised is in ``TIMER_TOPIC``, once; every commit the flush
    mode promised is in ``TRANSACTION_TOPIC`` once, and no such rollback is there."""
    delayed = _bodies(store_dir, config, TIMER_TOPIC)
    found = [f"delayed: {body[:12]!r} arrived {delayed[body]} times" for body in workload.delayed_durable
             if delayed[body] != 1]
    found += [f"delayed: {body[:12]!r} arrived {count} times" for body, count in delayed.items() if count > 1]
    committed = _bodies(store_dir, config, TRANSACTION_TOPIC)
    for body, decision in workload.decided.items():
        if committed[body] != (1 if decision == "commit" else 0):
            found.append(f"transaction: {body[:12]!r} was a confirmed {decision} and arrived {committed[body]} times")
    return found


def _bodies(store_dir: Path, config: StoreConfig, topic: str) -> Counter[bytes]:
    reader = CommitLogReader.for_config(store_dir, config)
    cq = ConsumeQueue(store_dir, topic, 0, file_units=config.consume_queue_file_units, writable=False)
    try:
        arrived: Counter[bytes] = Counter()
        offset = cq.min_offset
        while (unit := cq.get(offset)) is not None:
            arrived[bytes(reader.read(unit.commit_log_offset, limit=1 << 62).body)] += 1
            offset += 1
        return arrived
    finally:
        cq.close()
        reader.segments.close()
