"""Answering ``query_by_key`` from the IndexFiles and the log, read-only (IndexService#queryOffset).

The front holds one ``KeyLookup`` and answers lookups itself: a lookup forwarded to
another actor paid two more process hops, which cost more than the lookup (with 8 in
flight, a request through a backend actor ran at a quarter of the rate of one the front
answers alone). The index builder writes the files; readers map them read-only.

Reading while the builder writes (the publication protocol; ``engine/_codec.c``):

* the builder (``codec.index_put_keys``) stores an item with plain stores, then its slot
  with a release store, then the header's fields (64-bit ones whole) and, last, the
  header's count with a release store: an item is added when the count covers it;
* this reader loads the count with an acquire load (``codec.index_header``, before every
  lookup), then the slot with an acquire load (``codec.index_select``), and answers only
  items below that count. The count's acquire makes every item below it complete, and the
  slot loaded after it leads to all of them. An item at or past the count (added since, or
  half-added by a killed builder, which ``repair_after_kill`` then rewrites) is never
  answered; only its ``prev`` is followed, readable because the slot's release came after
  it (read while ``repair_after_kill`` rewrites it, a ``prev`` can only lead to an older
  item, checked like any). Walks never go past the file's capacity; ``prev`` only goes back.

Release and acquire are C11 atomics on naturally aligned words (``stlr``/``ldar`` on
aarch64, ordered moves on x86-64). The pure-Python fallback codec, used only where the C
codec could not be built, reads and writes with plain ``struct`` calls: it relies on
x86-64 making stores visible in program order, and is not safe on aarch64. A full newest
file makes the reader look for the next one.

The index gives candidate offsets; each candidate record is read from the log and kept
only if it passes its checks, lies below the visible end, belongs to the topic (records of
a deleted topic written before its deletion are never returned) and carries the key as
one of its KEYS or as its UNIQ_KEY (hash collisions never reach the client).
"""

from __future__ import annotations

from pathlib import Path

from engine.codec_py import MessageMap
from engine.config import StoreConfig
from engine.errors import ErrorCode, RequestError
from engine.ipc.protocol import QueryByKeyRequest, QueryByKeysRequest, decode_as, encode_reply
from engine.layout import RecordError
from engine.store.commit_log import CommitLogReader
from engine.store.deleted_topics import DeletedTopics
from engine.store.index_file import IndexService


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
        request = decode_as(QueryByKeyRequest, raw)
        messages = self.find(request.topic, request.key, max_results=request.max_results,
                             begin_ms=request.begin_timestamp, end_ms=request.end_timestamp,
                             visible_end=visible_end, deletions=deletions)
        return encode_reply(request.id, messages=messages)

    def answer_many(self, raw: bytes, *, visible_end: int, deletions: int) -> bytes:
        """The reply to a ``query_by_keys`` request: each key's messages, in the keys' order, as far as
        ``pull_bytes_max`` allows (the reply then answers the first keys only: the client asks again
        for the rest); RequestError if the request is malformed or has too many keys."""
        request = decode_as(QueryByKeysRequest, raw)
        if len(request.keys) > self.config.query_keys_per_request_max:
            raise RequestError(ErrorCode.LIMIT_EXCEEDED, f"{len(request.keys)} keys in one query_by_keys; at most "
                                                         f"{self.config.query_keys_per_request_max} "
                                                         f"(query_keys_per_request_max)")
        found: list[list[MessageMap]] = []
        reply_bytes = 0
        for key in request.keys:
            messages = self.find(request.topic, key, max_results=request.max_results,
                                 begin_ms=request.begin_timestamp, end_ms=request.end_timestamp,
                                 visible_end=visible_end, deletions=deletions)
            reply_bytes += sum(message["store_size"] for message in messages)
            if found and reply_bytes > self.config.pull_bytes_max:
                break
            found.append(messages)
        return encode_reply(request.id, found=found)

    def find(self, topic: str, key: str, *, max_results: int, begin_ms: int, end_ms: int, visible_end: int,
             deletions: int) -> list[MessageMap]:
        """The messages of ``topic`` with ``key`` (a key or the UNIQ_KEY), stored in [begin_ms, end_ms],
        oldest first; at most ``max_results`` (and ``query_result_count_max``) and about
        ``pull_bytes_max`` bytes, the newest kept when capped."""
        count_max = min(max_results, self.config.query_result_count_max)
        self.deleted_topics.follow(deletions)
        self.index.follow_writer()
        candidates = self.index.query(topic, key, count_max=count_max * 4, begin_ms=begin_ms, end_ms=end_ms)
        log_min = self.reader.min_offset()
        messages: list[MessageMap] = []
        reply_bytes = 0
        for offset in candidates:  # newest first: a capped answer keeps the newest matches
            if not log_min <= offset < visible_end or self.deleted_topics.hides(topic, offset):
                continue
            try:
                view = self.reader.read_view(offset, limit=visible_end)
            except RecordError:
                continue
            if view["topic"] != topic or (key not in view["keys"] and view["uniq_key"] != key):
                continue  # a hash collision
            reply_bytes += view["store_size"]
            if messages and reply_bytes > self.config.pull_bytes_max:
                break
            messages.append(view)
            if len(messages) >= count_max:
                break
        messages.sort(key=lambda m: m["commit_log_offset"])
        return messages

    def after_retention(self) -> None:
        """Segments and index files were deleted: let their mappings go."""
        self.reader.segments.refresh()
        self.index.refresh()

    def close(self) -> None:
        self.reader.segments.close()
        self.index.close()
