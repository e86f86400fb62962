"""The batch codec in plain Python: the reference the compiled ``engine._codec`` must match.

Each function does, for a whole batch, what the hot paths would otherwise do one
record at a time through ``engine.layout``; the compiled module does the same
byte for byte and answer for answer (``tests/unit/test_codec.py`` compares them).
Use them through ``engine.codec``, which picks the compiled module when it is built.

Failures are never decided here beyond "not the fast path": ``scan_dispatch`` stops
at a record it cannot dispatch and ``read_view`` returns None, and the caller asks
``engine.layout`` (which raises ``RecordError`` with the reason).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import msgspec

from engine.layout import (
    CQ_UNIT,
    CRC32_RESERVED_BYTES,
    INDEX_HEADER,
    INDEX_ITEM,
    INDEX_SLOT,
    IPV6_BYTES,
    KEY_SEPARATOR,
    MAGIC_BLANK,
    NAME_VALUE_SEPARATOR,
    PROPERTY_CRC32,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    TOTAL_SIZE_AND_MAGIC,
    HostAddress,
    ReadBuffer,
    RecordError,
    RecordFields,
    WriteBuffer,
    decode_record,
    encode_record_into,
    encoded_size,
    index_key_hash,
    java_string_hash,
    tags_code,
)

COMPILED = False

SCAN_MORE = 0     # stopped at ``limit`` (less than a blank marker left) or after ``max_records``
SCAN_BLANK = 1    # the end-of-segment blank marker is at ``pos``
SCAN_DAMAGE = 2   # the record at ``pos`` fails a check: decode it with ``engine.layout`` for the reason

# A ``DispatchEntry``'s fields as a tuple (see ``scan_dispatch``).
DispatchTuple = tuple[str, int, int, int, int, int, int, list[str]]

# A dispatch entry packed: how the reput dispatcher sends a receiver its entries, one
# bytes object a batch and no object a record (``scan_dispatch(..., packed=True)``).
#
#   queue_offset i64 | commit_log_offset i64 | store_timestamp i64 | tags_code i64 |
#   size i32 | queue_id i32 | topic_bytes u16 | key_count u16            44 bytes, little-endian
#   topic (UTF-8, topic_bytes) | then per key: key_bytes u16 | key (UTF-8)
PACKED_ENTRY = struct.Struct("<qqqqiiHH")
PACKED_KEY = struct.Struct("<H")

# One record for ``encode_records``: (body, encoded properties, flag, born_timestamp_ms) as
# ``build_items`` makes it, or with sys_flag and prepared_transaction_offset after those.
SendItem = tuple[bytes, bytes, int, int]
RecordItem = SendItem | tuple[bytes | memoryview, bytes, int, int, int, int]

# A record as a reply's message map (``read_view``): ``engine.ipc.protocol.MessageView``'s
# fields by name. A plain dict and not a TypedDict, for now: the compiled codec builds it, the
# reply encoder takes it as it is, and the actors that serve it add fields of their replies
# (a transaction check's ``check_times``) and hand it on as ``dict[str, Any]``.
MessageMap = dict[str, Any]


class ClientMessage(Protocol):
    """One message of a send as the client gave it (``engine.ipc.protocol.SendMessage`` is one):
    the codec and the store read these fields and do not import the wire protocol."""

    @property
    def body(self) -> bytes: ...
    @property
    def tags(self) -> str | None: ...
    @property
    def keys(self) -> Sequence[str]: ...
    @property
    def properties(self) -> Mapping[str, str]: ...
    @property
    def flag(self) -> int: ...
    @property
    def born_timestamp(self) -> int | None: ...

_HIDDEN_PROPERTIES = (PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_CRC32)


def java_hash(text: str) -> int:
    """Java ``String.hashCode`` as a signed 32-bit int."""
    return java_string_hash(text)


def owner_index(topic: str, queue_id: int, owner_count: int) -> int:
    """Which ConsumeQueue owner holds (topic, queue_id): the topic's queues go round the owners,
    from the one the CRC-32 of its name picks."""
    return (zlib.crc32(f"{topic}".encode()) + queue_id) % owner_count


def encode_records(buf: WriteBuffer, pos: int, base_offset: int, topic: bytes, queue_id: int, first_queue_offset: int,
                   store_timestamp_ms: int, store_host: HostAddress, born_host: HostAddress,
                   with_record_crc: bool, items: Sequence[RecordItem]) -> tuple[list[int], int]:
    """Encode a batch of records for one queue at ``buf[pos:]``.

    ``items`` are ``(body, properties, flag, born_timestamp_ms)`` with the properties
    already encoded, or those and ``sys_flag, prepared_transaction_offset`` (a committed
    transaction's record; 0 and 0 otherwise). SYSFLAG's host bits come from the hosts:
    an ip of 16 bytes is IPv6. ``base_offset`` is the commit log offset of ``buf[0]``.
    Returns the commit log offset of every record and the position after the last one.
    ValueError when the batch does not fit in ``buf`` (nothing is written then).
    """
    fields = [RecordFields(topic, queue_id, item[0], item[1], item[2], item[3], born_host,
                           *((item[4], 0, item[5]) if len(item) == 6 else ()))
              for item in items]
    store_v6 = len(store_host.ip) == IPV6_BYTES
    total = sum(encoded_size(f, with_record_crc=with_record_crc, store_host_v6=store_v6) for f in fields)
    if pos < 0 or pos + total > len(buf):
        raise ValueError(f"a batch of {total} bytes does not fit at {pos} in a buffer of {len(buf)}")
    offsets = []
    for i, f in enumerate(fields):
        offsets.append(base_offset + pos)
        pos += encode_record_into(buf, pos, f, queue_offset=first_queue_offset + i,
                                  commit_log_offset=base_offset + pos, store_timestamp_ms=store_timestamp_ms,
                                  store_host=store_host, with_record_crc=with_record_crc)
    return offsets, pos


def pack_entry(entry: DispatchTuple) -> bytes:
    """A ``DispatchEntry``'s fields packed (``PACKED_ENTRY``)."""
    topic, queue_id, queue_offset, commit_log_offset, size, code, store_ts, keys = entry
    name = topic.encode()
    parts = [PACKED_ENTRY.pack(queue_offset, commit_log_offset, store_ts, code, size, queue_id, len(name), len(keys)),
             name]
    for key in keys:
        raw = key.encode(errors="surrogatepass")
        parts += [PACKED_KEY.pack(len(raw)), raw]
    return b"".join(parts)


def unpack_entry(packed: bytes, pos: int) -> tuple[DispatchTuple, int]:
    """The packed entry at ``packed[pos:]`` as a ``DispatchEntry`` tuple, and where the next begins.
    ValueError if it runs past the end of ``packed``."""
    if not 0 <= pos <= len(packed) - PACKED_ENTRY.size:
        raise ValueError("a packed dispatch entry runs past the end of its bytes")
    queue_offset, clo, store_ts, code, size, queue_id, topic_bytes, key_count = PACKED_ENTRY.unpack_from(packed, pos)
    at = pos + PACKED_ENTRY.size
    topic = packed[at:at + topic_bytes].decode()
    at += topic_bytes
    keys = []
    for _ in range(key_count):
        (length,) = PACKED_KEY.unpack_from(packed, at)
        keys.append(packed[at + 2:at + 2 + length].decode(errors="replace"))
        at += 2 + length
    if at > len(packed) or len(topic.encode()) != topic_bytes:
        raise ValueError("a packed dispatch entry runs past the end of its bytes")
    return (topic, queue_id, queue_offset, clo, size, code, store_ts, keys), at


def scan_dispatch(buf: ReadBuffer, pos: int, limit: int, base_offset: int, max_records: int,
                  owner_count: int, index_uniq: bool = True, packed: bool = False,
                  ) -> tuple[list[Any], Any, int, int, int]:
    """Parse records from ``buf[pos:limit]`` for dispatch, without CRC checks.

    Returns ``(per_owner, for_index, count, pos, stop)``: per owner the entries of its
    queues, the entries that carry keys for the index builder, how many records were
    parsed, where the scan stopped and why (``SCAN_*``). An entry is a ``DispatchEntry``
    as a tuple: (topic, queue_id, queue_offset, commit_log_offset, size, tags_code,
    store_timestamp, keys); owners get it with no keys, the index with the UNIQ_KEY
    first (unless ``index_uniq`` is off: ``index_uniq_key_enabled``), then the user keys.
    With ``packed``, each owner's entries and the index's are one bytes object of packed
    entries (``PACKED_ENTRY``) instead of lists.
    """
    per_owner, for_index, count, pos, stop = _scan_entries(buf, pos, limit, base_offset, max_records, owner_count,
                                                           index_uniq)
    if not packed:
        return per_owner, for_index, count, pos, stop
    return ([b"".join(map(pack_entry, mine)) for mine in per_owner], b"".join(map(pack_entry, for_index)), count, pos,
            stop)


def _scan_entries(buf: ReadBuffer, pos: int, limit: int, base_offset: int, max_records: int, owner_count: int,
                  index_uniq: bool) -> tuple[list[list[DispatchTuple]], list[DispatchTuple], int, int, int]:
    per_owner: list[list[DispatchTuple]] = [[] for _ in range(owner_count)]
    for_index: list[DispatchTuple] = []
    count = 0
    size_bytes = len(buf)
    while count < max_records:
        if limit - pos < 8:
            return per_owner, for_index, count, pos, SCAN_MORE
        size, magic = TOTAL_SIZE_AND_MAGIC.unpack_from(buf, pos)
        if magic == MAGIC_BLANK and size == size_bytes - pos:
            return per_owner, for_index, count, pos, SCAN_BLANK
        try:
            record = decode_record(buf, pos, limit=limit, base_offset=base_offset, check_crc=False)
        except RecordError:
            return per_owner, for_index, count, pos, SCAN_DAMAGE
        props = record.properties
        tags = props.get(PROPERTY_TAGS)
        code = tags_code(tags)
        topic, queue_id = record.topic, record.queue_id
        entry: DispatchTuple = (topic, queue_id, record.queue_offset, record.commit_log_offset, record.total_size, code,
                 record.store_timestamp_ms, [])
        per_owner[owner_index(topic, queue_id, owner_count)].append(entry)
        keys = [k for k in props.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]
        uniq = props.get(PROPERTY_UNIQ_KEY) if index_uniq else None
        if uniq or keys:
            for_index.append((*entry[:7], [uniq, *keys] if uniq else keys))
        pos += record.total_size
        count += 1
    return per_owner, for_index, count, pos, SCAN_MORE


def read_view(buf: ReadBuffer, pos: int, limit: int, base_offset: int, check_crc: bool,
              require_record_crc: bool) -> MessageMap | None:
    """The record at ``buf[pos:]`` as a reply's message map (``MessageView``'s fields, in
    order); None if it fails any check."""
    try:
        record = decode_record(buf, pos, limit=limit, base_offset=base_offset, check_crc=check_crc,
                               require_record_crc=require_record_crc)
    except RecordError:
        return None
    props = record.properties
    return {
        "topic": record.topic, "queue_id": record.queue_id, "queue_offset": record.queue_offset,
        "commit_log_offset": record.commit_log_offset, "store_size": record.total_size, "msg_id": record.msg_id,
        "body": bytes(record.body), "body_crc": record.body_crc, "tags": props.get(PROPERTY_TAGS),
        "keys": [k for k in props.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k],
        "uniq_key": props.get(PROPERTY_UNIQ_KEY),
        "properties": {k: v for k, v in props.items() if k not in _HIDDEN_PROPERTIES},
        "flag": record.flag, "sys_flag": record.sys_flag, "born_timestamp": record.born_timestamp_ms,
        "born_host": str(record.born_host), "store_timestamp": record.store_timestamp_ms,
        "store_host": str(record.store_host), "reconsume_times": record.reconsume_times,
    }



def index_put_keys(buf: WriteBuffer, hash_slot_count: int, index_count_max: int, prefix: str, keys: list[str],
                   commit_log_offset: int, store_timestamp_ms: int) -> int:
    """IndexFile#putKey for ``prefix + key`` of every key, in the index file mapped at ``buf``.

    The header in ``buf`` is the state: read first, rewritten after every item (a kill
    between an item and its header leaves one uncounted item, which
    ``IndexFile.repair_after_kill`` unlinks). Returns how many keys were added: fewer
    than ``len(keys)`` when the file filled up.
    """
    begin_ts, end_ts, begin_phy, end_phy, slots_used, count = INDEX_HEADER.unpack_from(buf, 0)
    count = max(count, 1)  # item 0 is never used: 0 in a slot means an empty bucket
    items_base = INDEX_HEADER.size + hash_slot_count * INDEX_SLOT.size
    added = 0
    for key in keys:
        if count >= index_count_max:
            break
        key_hash = index_key_hash(prefix + key)
        slot_pos = INDEX_HEADER.size + (key_hash % hash_slot_count) * INDEX_SLOT.size
        (previous,) = INDEX_SLOT.unpack_from(buf, slot_pos)
        if previous <= 0 or previous > count:
            previous = 0
        time_diff = 0 if begin_ts <= 0 else min(max((store_timestamp_ms - begin_ts) // 1000, 0), 0x7FFFFFFF)
        INDEX_ITEM.pack_into(buf, items_base + count * INDEX_ITEM.size, key_hash, commit_log_offset, time_diff,
                             previous)
        INDEX_SLOT.pack_into(buf, slot_pos, count)
        if count <= 1:
            begin_phy, begin_ts = commit_log_offset, store_timestamp_ms
        if previous == 0:
            slots_used += 1
        count += 1
        end_phy, end_ts = commit_log_offset, store_timestamp_ms
        INDEX_HEADER.pack_into(buf, 0, begin_ts, end_ts, begin_phy, end_phy, slots_used, count)
        added += 1
    return added


def index_put_records(buf: WriteBuffer, hash_slot_count: int, index_count_max: int, entries: Sequence[Any],
                      entry: int, key: int, min_offset: int) -> tuple[int, int]:
    """``index_put_keys`` for every record of ``entries`` (``DispatchEntry``s, or their fields as
    tuples) from ``entries[entry]``'s ``keys[key:]`` on, skipping records below ``min_offset``,
    while the file has room below ``index_count_max``. Returns where it stopped: ``(entry, key)``,
    ``(len(entries), 0)`` once every record is in. ``entries`` may also be bytes of packed entries
    (``PACKED_ENTRY``): ``entry`` is then a byte position in them."""
    count = max(INDEX_HEADER.unpack_from(buf, 0)[5], 1)
    while entry < len(entries) and count < index_count_max:
        item, after = unpack_entry(entries, entry) if isinstance(entries, bytes) else (entries[entry], entry + 1)
        topic, offset, store_ts, keys = ((item[0], item[3], item[6], item[7]) if isinstance(item, tuple) else
                                         (item.topic, item.commit_log_offset, item.store_timestamp, item.keys))
        if offset >= min_offset:
            added = index_put_keys(buf, hash_slot_count, index_count_max, f"{topic}#", keys[key:], offset, store_ts)
            count += added
            if key + added < len(keys):
                return entry, key + added
        entry, key = after, 0
    return entry, key if entry < len(entries) else 0


def cq_put_packed(packed: bytes, pos: int, min_offset: int, queues: Mapping[tuple[str, int], Any],
                  touched: set[Any]) -> int:
    """``ConsumeQueue.put`` for the packed entries of ``packed[pos:]``, records below ``min_offset``
    skipped, while each is the next unit of a queue of ``queues`` and lies in its window
    (``ConsumeQueue.window``, ``window_start``, ``window_end``: reserved, counted for the next
    flush). Returns the position of the first entry left to ``ConsumeQueue.put`` (a new queue or
    file, a gap, a replay), ``len(packed)`` when none; the queues written to have ``max_offset``
    and ``max_physical_end`` moved and are added to ``touched``. ValueError for an entry that runs
    past the end: the units written before it stay counted."""
    while pos < len(packed):
        (topic, queue_id, queue_offset, clo, size, code, _ts, _keys), after = unpack_entry(packed, pos)
        if clo >= min_offset:
            cq = queues.get((topic, queue_id))
            at = queue_offset * CQ_UNIT.size
            if cq is None or cq.window is None or cq.window.closed or queue_offset != cq.max_offset \
                    or clo + size <= cq.max_physical_end \
                    or not cq.window_start <= at <= cq.window_end - CQ_UNIT.size or not 0 <= size <= 0x7FFFFFFF:
                return pos
            CQ_UNIT.pack_into(cq.window, at - cq.window_start, clo, size, code)
            cq.max_offset, cq.max_physical_end = queue_offset + 1, clo + size
            touched.add(cq)
        pos = after
    return pos


def index_header(buf: ReadBuffer) -> tuple[int, int, int, int, int, int]:
    """The IndexFile header: begin ts, end ts, begin phy, end phy, slots used, count.

    The compiled twin loads the count with acquire, then the rest whole; the writer's twin
    (``index_put_keys`` above) stores with plain writes. This fallback, used only where the
    C codec could not be built, relies on the processor making the writer's stores visible
    in program order, which x86-64 does and aarch64 does not promise: on x86-64 a slot seen
    leads to items stored before it, so even a count seen torn (``pack_into`` may store it a
    byte at a time) admits only complete items."""
    return INDEX_HEADER.unpack_from(buf, 0)


def index_select(buf: ReadBuffer, hash_slot_count: int, index_count_max: int, index_count: int, key_hash: int,
                 begin_ts: int, count_max: int, begin_ms: int, end_ms: int) -> list[int]:
    """Commit log offsets of the items in ``key_hash``'s chain, newest first (IndexFile#selectPhyOffset).

    ``index_count`` and ``begin_ts`` come from a header read before this call (``index_header``):
    only items below ``index_count`` are answered. An item at or past it (written after that
    header, or half-added by a killed builder) is passed over: not answered, its time does not
    end the walk, only its ``prev`` is followed. Bounded by the file's capacity and by ``prev``
    links that go strictly back. See ``index_header`` for what this fallback relies on."""
    items_base = INDEX_HEADER.size + hash_slot_count * INDEX_SLOT.size
    if len(buf) < items_base + index_count_max * INDEX_ITEM.size:
        raise ValueError("the buffer is smaller than an index file of these dimensions")
    (item,) = INDEX_SLOT.unpack_from(buf, INDEX_HEADER.size + (key_hash % hash_slot_count) * INDEX_SLOT.size)
    found: list[int] = []
    steps = 0
    while 0 < item < index_count_max and len(found) < count_max and steps < index_count_max:
        item_hash, offset, time_diff, prev = INDEX_ITEM.unpack_from(buf, items_base + item * INDEX_ITEM.size)
        if item < index_count:
            stored_ms = begin_ts + time_diff * 1000
            if item_hash == key_hash and begin_ms <= stored_ms <= end_ms:
                found.append(offset)
            if stored_ms < begin_ms:
                break
        if prev <= 0 or prev >= item:
            break
        item = prev
        steps += 1
    return found


_BLANK_UNIT_SIZE = 0x7FFFFFFF  # consume_queue.BLANK_UNIT_SIZE: a hole left by a damaged record
_encoder = msgspec.msgpack.Encoder()


def pull_run(units: ReadBuffer, units_pos: int, unit_count: int, segment: ReadBuffer, segment_start: int,
             visible_end: int, log_min: int, topic: str, queue_id: int, queue_offset: int, max_bytes: int,
             taken_bytes: int, require_record_crc: bool) -> tuple[bytes, int, int]:
    """Serve the plain run of an unfiltered pull: msgpack message maps, straight from the log.

    Walks ``unit_count`` ConsumeQueue units from ``units[units_pos:]`` (queue offsets from
    ``queue_offset``), whose records should lie in ``segment`` (the log segment starting at
    commit log offset ``segment_start``). Each unit that passes appends its record's
    message map, msgpack-encoded exactly as ``read_view``'s dict is by msgspec. The run
    stops *before* the first unit that does not pass, and the caller's general path
    decides about that one:

    * a blank or implausible unit; a record outside the segment, past ``visible_end``
      or below ``log_min``;
    * one more message would take the reply past ``max_bytes`` (``taken_bytes`` counts
      what the reply holds already; the first message is always taken);
    * the record fails a check (``read_view`` is None) or is not the unit's own record
      (topic, queue id, queue offset, size);
    * the record has text that is not UTF-8 (topic, property names or values) or a
      property name twice: the general path decodes those with replacement characters.

    Returns ``(maps, count, taken_bytes)``: the concatenated maps, how many (each one
    unit), and ``taken_bytes`` plus their sizes.
    """
    views, taken_bytes = _plain_run(units, units_pos, unit_count, segment, segment_start, visible_end, log_min,
                                    topic, queue_id, queue_offset, max_bytes, taken_bytes, require_record_crc)
    return b"".join(_encoder.encode(view) for view in views), len(views), taken_bytes


def pull_objects(factory: Callable[..., Any], tuple_keys: bool, units: ReadBuffer, units_pos: int,
                 unit_count: int, segment: ReadBuffer, segment_start: int, visible_end: int, log_min: int,
                 topic: str, queue_id: int, queue_offset: int, max_bytes: int, taken_bytes: int,
                 require_record_crc: bool) -> tuple[list[Any], int, int]:
    """``pull_run``'s run, each message built straight into ``factory(**fields)``, the fields of
    ``read_view``'s dict (``keys`` a tuple with ``tuple_keys``, else a list): the reader's own
    objects (``MessageView``, ``rmqpy.Message``) without the encode and the decode between.
    Returns ``(messages, count, taken_bytes)``."""
    views, taken_bytes = _plain_run(units, units_pos, unit_count, segment, segment_start, visible_end, log_min,
                                    topic, queue_id, queue_offset, max_bytes, taken_bytes, require_record_crc)
    if tuple_keys:
        for view in views:
            view["keys"] = tuple(view["keys"])
    return [factory(**view) for view in views], len(views), taken_bytes


def _plain_run(units: ReadBuffer, units_pos: int, unit_count: int, segment: ReadBuffer, segment_start: int,
               visible_end: int, log_min: int, topic: str, queue_id: int, queue_offset: int, max_bytes: int,
               taken_bytes: int, require_record_crc: bool) -> tuple[list[dict[str, Any]], int]:
    """The views of ``pull_run``'s run, and ``taken_bytes`` plus their sizes."""
    views: list[dict[str, Any]] = []
    limit_in_segment = min(len(segment), visible_end - segment_start)
    for i in range(unit_count):
        commit_log_offset, size, _code = CQ_UNIT.unpack_from(units, units_pos + i * CQ_UNIT.size)
        if not 0 < size < _BLANK_UNIT_SIZE or commit_log_offset < 0:
            break
        pos = commit_log_offset - segment_start
        if pos < 0 or pos + size > len(segment) or commit_log_offset + size > visible_end \
                or commit_log_offset < log_min:
            break
        if taken_bytes > 0 and taken_bytes + size > max_bytes:
            break
        view = read_view(segment, pos, limit_in_segment, segment_start, True, require_record_crc)
        if view is None or (view["topic"], view["queue_id"], view["queue_offset"], view["store_size"]) != \
                (topic, queue_id, queue_offset + i, size):
            break
        if not _plain_text(segment, pos, size, segment_start):
            break
        views.append(view)
        taken_bytes += size
    return views, taken_bytes


def _plain_text(segment: ReadBuffer, pos: int, size: int, segment_start: int) -> bool:
    """The record's properties block is valid UTF-8 and names no property twice."""
    raw = bytes(decode_record(segment, pos, limit=pos + size, base_offset=segment_start,
                              check_crc=False).properties_raw)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    names = [name for name, sep, value in (entry.partition(b"\x01") for entry in raw.split(b"\x02"))
             if name and sep and value]
    return len(names) == len(set(names))


_RESERVED_NAMES = (PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_CRC32)


def build_items(messages: Sequence[ClientMessage], body_bytes_max: int, properties_bytes_max: int,
                uniq_keys: list[str], now_ms: int) -> tuple[list[SendItem] | None, int]:
    """Validate a batch of ``SendMessage``s and encode their properties, as the writer stores them.

    Returns ``(items, payload_bytes)``: per message ``(body, properties, flag,
    born_timestamp_ms)`` and the bodies plus encoded properties in all. Or ``(None, i)``
    when message ``i`` is the first refused (``records.build_items`` says why). A message is
    refused for an empty body or one over ``body_bytes_max``; a property name or value, a
    tag or a key holding ``\\x01`` or ``\\x02``; an empty or reserved property name (KEYS,
    TAGS, __CRC32#); an empty property value; an empty key or one with a space; properties
    that take more than ``properties_bytes_max`` with the 20 bytes of the record CRC.

    Properties are encoded as ``name\\x01value\\x02``: the user's in their order, then
    TAGS, KEYS (joined by spaces) and, unless the user set one, UNIQ_KEY from
    ``uniq_keys[i]``. ``born_timestamp_ms`` is the message's or ``now_ms``.
    """
    items = []
    payload = 0
    for i, message in enumerate(messages):
        body = message.body
        if not body or len(body) > body_bytes_max:
            return None, i
        parts = []
        has_uniq = False
        for name, value in message.properties.items():
            if not name or not value or name in _RESERVED_NAMES or _has_separator(name) or _has_separator(value):
                return None, i
            has_uniq = has_uniq or name == PROPERTY_UNIQ_KEY
            parts.append(f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
        if message.tags:
            if _has_separator(message.tags):
                return None, i
            parts.append(f"{PROPERTY_TAGS}{NAME_VALUE_SEPARATOR}{message.tags}{PROPERTY_SEPARATOR}")
        if message.keys:
            if any(not key or KEY_SEPARATOR in key or _has_separator(key) for key in message.keys):
                return None, i
            parts.append(f"{PROPERTY_KEYS}{NAME_VALUE_SEPARATOR}{KEY_SEPARATOR.join(message.keys)}"
                         f"{PROPERTY_SEPARATOR}")
        if not has_uniq:
            parts.append(f"{PROPERTY_UNIQ_KEY}{NAME_VALUE_SEPARATOR}{uniq_keys[i]}{PROPERTY_SEPARATOR}")
        encoded = "".join(parts).encode()
        if len(encoded) + CRC32_RESERVED_BYTES > properties_bytes_max:
            return None, i
        born = message.born_timestamp
        items.append((body, encoded, message.flag, now_ms if born is None else born))
        payload += len(body) + len(encoded)
    return items, payload


def _has_separator(text: str) -> bool:
    return NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text


# A batch the client encodes (RocketMQ's MessageBatch body, ``MessageDecoder.encodeMessages``),
# each message in turn, big-endian:
#
#   0  TOTALSIZE i32    4  MAGICCODE i32 (0)    8  BODYCRC i32 (0)    12 FLAG i32
#   16 BODYLEN i32, BODY, PROPLEN u16, PROPERTIES "name\x01value\x02..."
#
# TOTALSIZE = 22 + BODYLEN + PROPLEN. MAGICCODE and BODYCRC are written 0 and not read: the
# writer computes the record's CRCs itself, as RocketMQ's broker does.
BATCH_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODYLEN
BATCH_FIXED_BYTES = BATCH_HEAD.size + 2  # and PROPLEN
_PAIR = NAME_VALUE_SEPARATOR.encode()
_ENTRY_END = PROPERTY_SEPARATOR.encode()


def batch_entries(records: bytes | memoryview) -> tuple[list[tuple[int, bytes, bytes]], int | None]:
    """The (flag, body, properties) of each message of an encoded batch, up to the first that is
    cut short or whose sizes disagree, and that one's index (None when all are whole)."""
    entries: list[tuple[int, bytes, bytes]] = []
    data = bytes(records)
    pos = 0
    while pos < len(data) or not entries:
        if len(data) - pos < BATCH_FIXED_BYTES:
            return entries, len(entries)
        total, _magic, _crc, flag, body_len = BATCH_HEAD.unpack_from(data, pos)
        if total > len(data) - pos or body_len <= 0 or body_len > total - BATCH_FIXED_BYTES:
            return entries, len(entries)
        at = pos + BATCH_HEAD.size
        (props_len,) = struct.unpack_from(">H", data, at + body_len)
        if BATCH_FIXED_BYTES + body_len + props_len != total:
            return entries, len(entries)
        props_at = at + body_len + 2
        entries.append((flag, data[at:at + body_len], data[props_at:props_at + props_len]))
        pos += total
    return entries, None


def client_properties_ok(raw: bytes, refused: tuple[bytes, ...]) -> tuple[bool, bool]:
    """(whether a client's encoded properties pass, whether one is UNIQ_KEY): entries
    ``name\x01value\x02`` to the last byte, each name and value non-empty, no ``\x01`` in a
    value, no name twice, none of ``refused`` nor __CRC32#, KEYS' keys non-empty, valid UTF-8."""
    if raw and not raw.endswith(_ENTRY_END):
        return False, False
    names = set()
    for entry in raw.split(_ENTRY_END)[:-1] if raw else []:
        name, sep, value = entry.partition(_PAIR)
        if not sep or not name or not value or _PAIR in value or name in names \
                or name == PROPERTY_CRC32.encode() or name in refused \
                or (name == PROPERTY_KEYS.encode() and not all(value.split(KEY_SEPARATOR.encode()))):
            return False, False
        names.add(name)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False, False
    return True, PROPERTY_UNIQ_KEY.encode() in names


def batch_items(records: bytes | memoryview, body_bytes_max: int, properties_bytes_max: int, uniq_prefix: str,
                uniq_first_seq: int, now_ms: int, born_timestamp_ms: int,
                refused_names: tuple[bytes, ...]) -> tuple[list[SendItem] | None, int]:
    """Check a batch the client encoded and take its items, as ``build_items`` makes them.

    Returns ``(items, payload_bytes)``: per message ``(body, properties, flag,
    born_timestamp_ms)``. Or ``(None, i)`` when message ``i`` is the first refused
    (``records.batch_items`` says why): cut short or with sizes that disagree; an empty body
    or one over ``body_bytes_max``; properties that ``client_properties_ok`` refuses, or that
    take more than ``properties_bytes_max`` with the 20 bytes of the record CRC. A message
    without UNIQ_KEY gets the id of counter ``uniq_first_seq + i`` (``uniq_keys``).
    """
    entries, cut_at = batch_entries(records)
    items: list[SendItem] = []
    payload = 0
    for i, (flag, body, raw) in enumerate(entries):
        ok, has_uniq = client_properties_ok(raw, refused_names)
        if len(body) > body_bytes_max or not ok:
            return None, i
        properties = raw
        if not has_uniq:
            [uniq] = uniq_keys(uniq_prefix, uniq_first_seq + i, 1, now_ms)
            properties += f"{PROPERTY_UNIQ_KEY}{NAME_VALUE_SEPARATOR}{uniq}{PROPERTY_SEPARATOR}".encode()
        if len(properties) + CRC32_RESERVED_BYTES > properties_bytes_max:
            return None, i
        items.append((body, properties, flag, born_timestamp_ms))
        payload += len(body) + len(properties)
    if cut_at is not None:
        return None, cut_at
    return items, payload


def batch_records(messages: Sequence[ClientMessage], uniq_prefix: str,
                  first_counter: int) -> tuple[bytes | None, list[str] | int]:
    """A client's batch encoded as RocketMQ's MessageBatch body, and each message's id.

    Properties are encoded as ``build_items`` encodes them (with no size limits: the engine
    holds the batch to its own); a message without UNIQ_KEY gets ``uniq_prefix`` and the 16
    upper-case hex digits of its counter, from ``first_counter``. ``(None, i)`` when message
    ``i`` is the first that ``build_items`` would refuse, or whose flag or properties do not
    fit the encoding (a signed 32-bit int; 65,535 bytes).
    """
    ids: list[str] = []
    parts: list[bytes] = []
    for i, message in enumerate(messages):
        uniq = f"{uniq_prefix}{first_counter + i:016X}"
        items, _ = build_items([message], 2**62, 2**62, [uniq], 0)
        flag = message.flag
        if items is None or len(items[0][1]) > 0xFFFF or not isinstance(flag, int) or not -2**31 <= flag < 2**31:
            return None, i
        [(body, properties, flag, _born)] = items
        parts += [BATCH_HEAD.pack(BATCH_FIXED_BYTES + len(body) + len(properties), 0, 0, flag, len(body)), body,
                  len(properties).to_bytes(2, "big"), properties]
        ids.append(message.properties.get(PROPERTY_UNIQ_KEY, uniq))
    return b"".join(parts), ids


def send_results(offsets: list[int], queue_id: int, first_queue_offset: int, store_timestamp_ms: int,
                 msg_id_prefix: str, status: str, status_code: int) -> bytes:
    """The reply's ``results``: a msgpack array of one ``SendResult`` map per stored record
    (``msg_id_prefix`` is the 16 hex digits of the store host, 40 for an IPv6 one; the offset follows)."""
    return _encoder.encode([
        {"status": status, "status_code": status_code, "msg_id": f"{msg_id_prefix}{offset:016X}",
         "queue_id": queue_id, "queue_offset": first_queue_offset + i, "commit_log_offset": offset,
         "store_timestamp": store_timestamp_ms}
        for i, offset in enumerate(offsets)])


def uniq_keys(prefix: str, first_seq: int, count: int, now_ms: int) -> list[str]:
    """``count`` message ids in MessageClientIDSetter's shape, for counters from ``first_seq``.

    Each is 32 upper-case hex digits (56 for an IPv6 host): ``prefix`` (the 12 of ip and pid, 36
    with an IPv6 ip), the counter's high 32 bits, the clock's low 32 bits, the counter's low 16 bits.
    """
    now = now_ms & 0xFFFFFFFF
    return [f"{prefix}{seq >> 16 & 0xFFFFFFFF:08X}{now:08X}{seq & 0xFFFF:04X}"
            for seq in range(first_seq, first_seq + count)]
