"""Answering ``query_by_key`` from the IndexFiles and the log, read-only (IndexService#queryOffset).

The front holds one ``KeyLookup`` and answers lookups itself: a lookup forwarded to
another actor paid two more process hops, which cost more than the lookup (with 8 in
flight, a request through a backend actor ran at a quarter of the rate of one the front
answers alone). The index builder writes the files; readers map them read-only.

Reading while the builder writes: the builder stores an item, then publishes it with a
release store of its slot, then the header's fields and, with a release store, its count
(``codec.index_put_keys``). This reader loads a slot (``codec.index_select``) and the
count (``codec.index_header``) with acquire loads before it reads what they lead to, so
a slot it sees points at a complete item on any processor (C11 atomics in the codec;
aarch64 needs them, x86-64 orders stores by itself). Items are walked by their ``prev``
links, never past the file's capacity. A reader's header may lag its slots by a few
items; it is reloaded before every lookup, and a full newest file makes the reader look
for the next one.

The index gives candidate offsets; each candidate record is read from the log and kept
only if it passes its checks, lies below the visible end, belongs to the topic (records of
a deleted topic written before its deletion are never returned) and carries the key as
one of its KEYS or as its UNIQ_KEY (hash collisions never reach the client).
"""

from __future__ import annotations

from pathlib import Path

from engine.commit_log import CommitLogReader
from engine.config import StoreConfig
from engine.deleted_topics import DeletedTopics
from engine.index_file import IndexService
from engine.ipc.protocol import QueryByKeyRequest, decode_request, encode_reply
from engine.layout import RecordError


class KeyLookup:
    def __init__(self, store_dir: Path, config: StoreConfig) -> None:
        self.config = config
        self.index = IndexService(store_dir, hash_slot_count=config.index_hash_slot_count,
                                  index_count_max=config.index_item_count_max, writable=False)
        self.reader = CommitLogReader.for_config(store_dir, config)
        self.deleted_topics = DeletedTopics(store_dir)

    def answer(self, raw: bytes, *, visible_end: int, deletions: int) -> bytes:
        """The reply to a ``query_by_key`` request; RequestError if the request is malformed.

        ``visible_end`` is how far readers may see the log; ``deletions`` the writer's
        ``TOPIC_DELETIONS`` count."""
        request = decode_request("query_by_key", raw)
        assert isinstance(request, QueryByKeyRequest)
        count_max = min(request.max_results, self.config.query_result_count_max)
        self.deleted_topics.follow(deletions)
        self.index.follow_writer()
        candidates = self.index.query(request.topic, request.key, count_max=count_max * 4,
                                      begin_ms=request.begin_timestamp, end_ms=request.end_timestamp)
        log_min = self.reader.min_offset()
        messages = []
        reply_bytes = 0
        for offset in candidates:  # newest first: a capped answer keeps the newest matches
            if not log_min <= offset < visible_end or self.deleted_topics.hides(request.topic, offset):
                continue
            try:
                view = self.reader.read_view(offset, limit=visible_end)
            except RecordError:
                continue
            if view["topic"] != request.topic or (request.key not in view["keys"] and view["uniq_key"] != request.key):
                continue  # a hash collision
            reply_bytes += view["store_size"]
            if messages and reply_bytes > self.config.pull_bytes_max:
                break
            messages.append(view)
            if len(messages) >= count_max:
                break
        messages.sort(key=lambda m: m["commit_log_offset"])
        return encode_reply(request.id, messages=messages)

    def after_retention(self) -> None:
        """Segments and index files were deleted: let their mappings go."""
        self.reader.segments.refresh()
        self.index.refresh()

    def close(self) -> None:
        self.reader.segments.close()
        self.index.close()
