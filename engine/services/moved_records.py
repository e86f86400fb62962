"""Which system-topic records were already moved to their real topic: the restart check of the
timer and the transaction actor (``engine/store/system_topics.py``).

A move is a record in a real topic whose ``ORIGIN_OFFSET`` names the system-topic record
it came from. An actor that restarts, or that lost the reply to a move, reads the log
from the point its checkpoint names (where the uncertain moves began) to the confirmed
end, and moves again only what it does not find: no message is moved twice.
"""

from __future__ import annotations

from engine.layout import Record
from engine.store.commit_log import CommitLogReader
from engine.store.system_topics import SYSTEM_TOPICS, origin_offset


def moved_since(reader: CommitLogReader, start: int, end: int) -> set[int]:
    """The ``ORIGIN_OFFSET`` of every move stored in [start, end) of the log."""
    moved: set[int] = set()
    for item in reader.scan(max(start, reader.min_offset()), end):
        if isinstance(item, Record) and item.topic not in SYSTEM_TOPICS:
            origin = origin_offset(item)
            if origin is not None:
                moved.add(origin)
    return moved
