"""A slice of the log read for catch-up: what the reput dispatcher would have sent for it.

An owner or the index builder that missed dispatch batches (a restart, a full queue)
reads the range from the log itself, ``catch_up_bytes_per_turn_max`` of it a loop turn,
with heartbeats between turns. The records are walked by the compiled codec
(``codec.scan_dispatch``, the dispatcher's own parse), which costs a tenth of decoding
them in Python: a slice stays far inside the heartbeat timeout on a loaded machine.
A record the codec stops at (or one across the slice's end) is handed to the full decoder,
which says whether it is damage (skipped: the reput dispatcher reports it) or a record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine import codec
from engine.codec_py import DispatchTuple
from engine.layout import END_FILE_MIN_BLANK_BYTES
from engine.store.commit_log import CommitLogReader, Damage

_RECORDS_PER_CALL = 4_096  # records one codec call walks at most (the slice's end bounds its bytes)


@dataclass
class LogSlice:
    """Entries as ``DispatchEntry`` tuples (``codec_py.scan_dispatch``), in log order."""

    per_owner: list[list[DispatchTuple]]
    for_index: list[DispatchTuple] = field(default_factory=list)
    end: int = 0  # the offset after the last record (or damage) read


def read_slice(reader: CommitLogReader, start: int, end: int, bytes_max: int, owner_count: int, *,
               index_uniq: bool = True) -> LogSlice:
    """The entries of the records in [start, end), stopping at the first record boundary at or
    past ``start + bytes_max``; index entries with the UNIQ_KEY first if ``index_uniq``."""
    assert bytes_max > 0 and owner_count >= 1
    found = LogSlice([[] for _ in range(owner_count)], end=start)
    stop = min(end, start + bytes_max)
    offset = start
    while offset < stop:
        segment = reader.segment_at(offset)
        if segment is None:  # retention took it, or the log is damaged: nothing to read in the range
            found.end = end
            return found
        base, mm = segment.start_offset, segment.mm
        segment_limit = min(segment.size_bytes, end - base)
        pos = offset - base
        while base + pos < stop:
            if segment_limit - pos < END_FILE_MIN_BLANK_BYTES:
                pos = segment.size_bytes
                break
            limit = min(segment_limit, stop - base)  # a record across ``stop`` is the decoder's
            if limit - pos < END_FILE_MIN_BLANK_BYTES:
                pos = _step_over(reader, found, base + pos, end, owner_count, index_uniq) - base
                continue
            owners, index, _count, pos, why = codec.scan_dispatch(mm, pos, limit, base, _RECORDS_PER_CALL,
                                                                  owner_count, index_uniq)
            for mine, entries in zip(found.per_owner, owners, strict=True):
                mine.extend(entries)
            found.for_index += index
            if why == codec.SCAN_BLANK:
                pos = segment.size_bytes
                break
            if why == codec.SCAN_DAMAGE:
                pos = _step_over(reader, found, base + pos, end, owner_count, index_uniq) - base
        offset = base + pos
    found.end = min(offset, end)
    return found


def _step_over(reader: CommitLogReader, found: LogSlice, offset: int, end: int, owner_count: int,
               index_uniq: bool) -> int:
    item = next(iter(reader.scan(offset, end, check_crc=False)))
    if isinstance(item, Damage):  # the reput dispatcher reports it
        return item.end
    entry: DispatchTuple = (item.topic, item.queue_id, item.queue_offset, item.commit_log_offset, item.total_size,
             codec.tags_code(item.tags), item.store_timestamp_ms, [])
    found.per_owner[codec.owner_index(item.topic, item.queue_id, owner_count)].append(entry)
    keys, uniq = item.keys, item.uniq_key if index_uniq else None
    if keys or uniq:
        found.for_index.append((*entry[:7], [uniq, *keys] if uniq else keys))
    return item.commit_log_offset + item.total_size
