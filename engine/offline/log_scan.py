"""Walk a stopped store's CommitLog to its end, reading only the bytes that hold data.

Segments are created at their full size but sparse, and blocks are reserved
ahead of the writes: past the log's end a segment reads as zeros, up to
1 GiB of them with the default ``segment_size_bytes``. RocketMQ's recovery
stops at the first position whose TOTALSIZE and MAGICCODE are zero; the
offline tools (``inspect``, ``check``, ``check --repair``) stop at each
segment's *data end*, the byte after its last non-zero byte::

    segment:  | record | record | ... | record | 0 0 0 0 ... (holes, reserved blocks) ... 0 |
              0                                ^ data end                                  size

The data end is found without reading the holes (``SEEK_DATA``/``SEEK_HOLE``)
and by reading the last data extent backwards in ``READ_BYTES`` windows. A
zero head *before* the data end is not the end: non-zero bytes follow it, so
it is damage (a zeroed page in the middle of the log) and the walk resumes
on the next valid record, searching no further than the data end. A record
may end in zero bytes (empty properties), so it is decoded up to the
segment's size, not the data end.

Memory stays bounded: the pages of the mapping behind the walk are released
every ``WINDOW_BYTES`` (``MADV_DONTNEED``: the page cache keeps them, this
process's resident set does not), so walking a log of many GiB costs a few
windows, not the log.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

from engine.layout import (
    END_FILE_MIN_BLANK_BYTES,
    MAGIC_BLANK,
    Record,
    RecordError,
    RecordHead,
    decode_record,
    peek_size_and_magic,
    verify_record,
)
from engine.store.commit_log import CommitLogReader, Damage, find_next_record
from engine.store.mapped_file import PAGE_BYTES

READ_BYTES = 64 << 10  # the last data extent is read backwards this many bytes at a time
WINDOW_BYTES = 1 << 20  # the mapping is released behind the walk this many bytes at a time


def data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The [start, end) ranges of the file that may hold data (holes left out)."""
    extents = []
    at = 0
    while at < size:
        try:
            start = os.lseek(fd, at, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole from here on
                break
            return [(0, size)]  # no SEEK_DATA on this file system: all of it may hold data
        end = min(size, os.lseek(fd, start, os.SEEK_HOLE))
        extents.append((start, end))
        at = end
    return extents


def data_end(path: Path) -> int:
    """The position after the last non-zero byte of ``path`` (0 if it holds none)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for start, end in reversed(data_extents(fd, os.fstat(fd).st_size)):
            at = end
            while at > start:
                low = max(start, at - READ_BYTES)
                kept = os.pread(fd, at - low, low).rstrip(b"\x00")
                if kept:
                    return low + len(kept)
                at = low
        return 0
    finally:
        os.close(fd)


def scan_log(reader: CommitLogReader, *, heads: bool = False,
             check_crc: bool = True) -> Iterator[Record | RecordHead | Damage]:
    """Every record of the log (its head only with ``heads``: every check, no properties decoded)
    and every damaged range, segment by segment, each up to its data end."""
    require = check_crc and reader.require_record_crc
    for start in list(reader.segments.known):
        segment = reader.segments.get(start)
        if segment is None:
            continue  # removed by retention since the directory was listed
        end = data_end(segment.path)
        mm, size = segment.mm, segment.size_bytes
        pos = released = 0
        while pos < end and size - pos >= END_FILE_MIN_BLANK_BYTES:
            total, magic = peek_size_and_magic(mm, pos)
            if magic == MAGIC_BLANK and total == size - pos:
                break  # the blank marker: the log goes on in the next segment
            try:
                item: Record | RecordHead
                if heads:
                    item = verify_record(mm, pos, limit=size, base_offset=start, require_record_crc=require)
                else:
                    item = decode_record(mm, pos, limit=size, base_offset=start, check_crc=check_crc,
                                         require_record_crc=require)
            except RecordError as exc:
                resume = find_next_record(segment, pos + 1, size, check_crc=check_crc, require_record_crc=require,
                                          search_end=end)
                stop = resume if resume is not None else end
                yield Damage(start + pos, start + stop, exc.reason)
                pos = stop
            else:
                yield item
                pos += item.total_size
            if pos - released >= WINDOW_BYTES:
                behind = pos - pos % PAGE_BYTES
                _release(mm, released, behind)
                released = behind
        _release(mm, released, min(size, end + PAGE_BYTES - end % PAGE_BYTES))


def _release(mm: mmap.mmap, start: int, end: int) -> None:
    """Drop [start, end) of a read-only mapping from this process's resident set."""
    if end > start and hasattr(mmap, "MADV_DONTNEED"):
        mm.madvise(mmap.MADV_DONTNEED, start, end - start)
