"""The writer's appends: a send's batch checked, given its queue offsets, and appended whole.

For each send the front routed (``Append``: the queue it chose, whether it came from the
engine's own actors, the sender's IP), ``append``:

* refuses it while retention says the disk is too full (``refuse_sends``, DISK_FULL), or
  when no queue was chosen;
* rewrites where it is stored (a delayed or transactional send goes to its system topic:
  ``engine/services/writer/delivery_routes.py``) and builds its records, all or nothing
  (``engine/store/records.py``), from its messages or from the records the client
  encoded (RocketMQ's MessageBatch body: checked, ids given where they have none); a
  batch larger than ``send_batch_bytes_max`` (or than a segment) is MESSAGE_ILLEGAL;
* gives its messages the next queue offsets of their queue (one counter per topic-queue,
  rebuilt from the log at start) and appends them into the mapped segment.

An append the disk refuses (full, read-only, failing) is DISK_FULL or SERVICE_NOT_AVAILABLE,
logged once an episode; the writer is DEGRADED until ``retry_refused`` finds the disk takes
the last refused batch again.

Called by the writer (``engine/actors/commit_log_writer.py``) for each ``Append``, at
recovery (the queue counters) and each tick (``retry_refused``); a recorded topic deletion
drops the topic's counters (``forget_topic``).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

import msgspec

from engine import codec
from engine.codec import send_results
from engine.config import StoreConfig
from engine.errors import ErrorCode, PutStatus, RequestError
from engine.ipc.protocol import SendRequest
from engine.layout import END_FILE_MIN_BLANK_BYTES, SYSFLAG_TRANSACTION_COMMIT, HostAddress
from engine.services.writer.delivery_routes import check_plain_records, destination
from engine.store.commit_log import CommitLogWriter
from engine.store.disk_refusals import DiskRefusals
from engine.store.disk_space import disk_space
from engine.store.records import UniqKeys, batch_items, build_items
from engine.store.system_topics import SYSTEM_PROPERTIES

# refused with DISK_FULL; other errors of the disk with SERVICE_NOT_AVAILABLE (a read-only file system, EIO)
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# the routing properties a client's records may not carry (its messages may not either: delivery_routes)
ENGINE_ONLY_PROPERTIES = tuple(sorted(name.encode() for name in SYSTEM_PROPERTIES))


@dataclass
class Stored:
    """Where a batch went: enough to encode its results with either status."""

    offsets: list[int]
    queue_id: int
    first_queue_offset: int
    store_timestamp_ms: int

    def results(self, msg_id_prefix: str, status: PutStatus) -> msgspec.Raw:
        return msgspec.Raw(send_results(self.offsets, self.queue_id, self.first_queue_offset,
                                        self.store_timestamp_ms, msg_id_prefix, status.name, int(status)))


class LogAppends:
    """The queue counters, the last store time, and the appends the disk refuses."""

    def __init__(self, log: CommitLogWriter, store_dir: Path, config: StoreConfig, *, store_host: HostAddress,
                 uniq_keys: UniqKeys) -> None:
        self.log = log
        self.store_dir = store_dir
        self.config = config
        self.store_host = store_host
        self.uniq_keys = uniq_keys
        self.next_queue_offset: dict[tuple[str, int], int] = {}
        self.last_store_timestamp_ms = 0
        self.refuse_sends = False  # the disk is past disk_space_warning_level_ratio (retention says)
        # Appends the disk refuses (full, read-only, failing): logged once an episode, and the
        # engine is DEGRADED (``condition``) until a retry (``retry_refused``) takes them.
        self.refusals = DiskRefusals("writer: appends", errnos=None, event_kind="segment.create_failed")
        self.refused_batch_bytes = 0  # the last refused append's size, which the retry reserves
        self.sent_messages: dict[tuple[str, int], int] = {}  # since this process started, for metrics
        self.sent_bytes: dict[tuple[str, int], int] = {}

    def append(self, request: SendRequest, queue_id: int, *, now_ms: int, internal: bool = False,
               born_host: HostAddress | None = None) -> tuple[Stored, int]:
        """Validate and append a whole batch (all or nothing); RequestError if refused. ``now_ms``: the
        wall clock; ``born_host``: the sender's address (``Append.born_ip``), the store host when it has none."""
        if queue_id < 0:
            raise RequestError(ErrorCode.QUEUE_NOT_FOUND, "no queue was chosen for this send")
        if self.refuse_sends:
            raise RequestError(ErrorCode.DISK_FULL, f"the disk is more than "
                                                    f"{self.config.disk_space_warning_level_ratio:.0%} full; "
                                                    f"sends are refused until retention frees space")
        if request.records is not None:  # encoded by the client: checked, then stored as they are
            check_plain_records(request)
            topic_name = request.topic
            batch = batch_items(request.records, config=self.config, uniq_keys=self.uniq_keys, now_ms=now_ms,
                                born_ms=request.born_timestamp, refused_names=ENGINE_ONLY_PROPERTIES)
        else:
            topic_name, queue_id, messages = destination(request, queue_id, config=self.config, now_ms=now_ms,
                                                         internal=internal)
            batch = build_items(messages, config=self.config, uniq_keys=self.uniq_keys, now_ms=now_ms)
        topic = topic_name.encode()
        items = batch.items
        if request.committed_half is not None:  # as EndTransactionProcessor stores a commit
            items = [(*item, SYSFLAG_TRANSACTION_COMMIT, request.committed_half) for item in items]
        born_host = born_host or self.store_host
        batch_bytes = self.log.items_size(topic, len(items), batch.payload_bytes, born_host=born_host)
        # One message may be as large as message_body_bytes_max; a batch of several is held
        # to send_batch_bytes_max as encoded, so one request never holds the log for long.
        if (len(batch.items) > 1 and batch_bytes > self.config.send_batch_bytes_max) \
                or batch_bytes + END_FILE_MIN_BLANK_BYTES > self.config.segment_size_bytes:
            raise RequestError(ErrorCode.MESSAGE_ILLEGAL, f"the batch takes {batch_bytes} bytes as records; the "
                                                          f"limit is {self.config.send_batch_bytes_max}")
        key = (topic_name, queue_id)
        first = self.next_queue_offset.get(key, 0)
        store_ts = max(now_ms, self.last_store_timestamp_ms)
        try:
            appended = self.log.append_items(topic, queue_id, items, born_host=born_host,
                                             batch_bytes=batch_bytes, first_queue_offset=first,
                                             store_timestamp_ms=store_ts)
        except OSError as exc:
            needed, free = self.refused(exc, batch_bytes)
            if exc.errno not in FULL_ERRNOS:
                raise RequestError(ErrorCode.SERVICE_NOT_AVAILABLE,
                                   f"the log cannot be written: {exc.strerror or exc}; retry later") from None
            raise RequestError(ErrorCode.DISK_FULL, f"the disk has no room for this batch: it needs {needed} bytes "
                                                    f"(up to {self.config.segment_reserve_step_bytes} are reserved "
                                                    f"ahead at a time) and {free} bytes are free: {exc.strerror}"
                               ) from None
        self.refusals.written()
        self.next_queue_offset[key] = first + len(items)
        self.sent_messages[key] = self.sent_messages.get(key, 0) + len(items)
        self.sent_bytes[key] = self.sent_bytes.get(key, 0) + batch_bytes
        self.last_store_timestamp_ms = store_ts
        return Stored(appended.offsets, queue_id, first, store_ts), appended.end_offset

    def append_replicated(self, offset: int, data: bytes, *, deletions_crc: int, own_deletions_crc: int) -> str:
        """A replica's append of its master's log bytes at ``offset`` (``LogChunk``): "" when
        appended, else why not. Appended only at the log's end (at a segment's start while the
        log is empty: a master's oldest segment), and only whole records, whose queue offsets
        and store times the counters then follow (this replica may become a master)."""
        log = self.log
        size_bytes = self.config.segment_size_bytes
        empty = log.written_offset == 0 and not log.segments.known
        if deletions_crc != own_deletions_crc:
            return "the chunk was sent with another deletion table than this replica's"
        if offset != log.written_offset and not (empty and offset % size_bytes == 0):
            return f"the chunk is for {offset}, the log ends at {log.written_offset}"
        if offset % size_bytes + len(data) > size_bytes:
            return f"the chunk at {offset} of {len(data)} bytes crosses a segment's end"
        per_owner, _index, _count, parsed, stop = codec.scan_dispatch(data, 0, len(data), offset, len(data), 1,
                                                                      False)
        if parsed != len(data) and stop != codec.SCAN_BLANK:
            return f"the chunk at {offset} holds a damaged record at {offset + parsed}"
        log.written_offset = offset
        try:
            log.append_raw(data)
        except OSError as exc:
            self.refused(exc, len(data))
            return f"the log cannot be written: {exc.strerror or exc}"
        self.refusals.written()
        for topic, queue_id, queue_offset, _clo, _size, _tags, store_ms, _keys in per_owner[0]:
            self.next_queue_offset[(topic, queue_id)] = queue_offset + 1
            self.last_store_timestamp_ms = max(self.last_store_timestamp_ms, store_ms)
        return ""

    def refused(self, exc: OSError, batch_bytes: int) -> tuple[int, int]:
        """Note an append the disk refused (logged once an episode); (bytes needed, bytes free)."""
        free = disk_space(self.store_dir).free_bytes
        needed = batch_bytes + END_FILE_MIN_BLANK_BYTES
        self.refused_batch_bytes = batch_bytes
        self.refusals.refused(exc, self._reason(exc, needed, free))
        return needed, free

    def retry_refused(self) -> None:
        """While appends are refused: does the disk take the last refused one now? (Its blocks are
        reserved, not written; no send waits for this.) The episode ends when it does."""
        try:
            self.log.reserve_for(self.refused_batch_bytes)
        except OSError as exc:
            free = disk_space(self.store_dir).free_bytes
            self.refusals.reason = self._reason(exc, self.refused_batch_bytes + END_FILE_MIN_BLANK_BYTES, free)
            return
        self.refusals.written()

    @staticmethod
    def _reason(exc: OSError, needed: int, free: int) -> str:
        """Why appends are refused, in the words of the writer's ``condition``."""
        if exc.errno in FULL_ERRNOS:
            return f"cannot append: disk full (need {needed} bytes, {free} free)"
        return f"cannot append: {(exc.strerror or str(exc)).lower()}"

    def forget_topic(self, topic: str) -> int:
        """A recorded deletion: the topic's queues start again at 0; how many it had."""
        queues = [key for key in self.next_queue_offset if key[0] == topic]
        for key in queues:
            del self.next_queue_offset[key]
        return len(queues)
