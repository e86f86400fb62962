"""On-disk formats, byte for byte as Apache RocketMQ writes them (big-endian).

Every structure is drawn next to the ``struct.Struct`` that reads and writes it,
and every size is checked when this module is imported. The reference for each
field is ``shared/reference/rocketmq-store.md`` (sections 1, 3, 4 and 6).

Nothing here does I/O: these are pure encoders and decoders over buffers
(``bytes``, ``bytearray``, ``mmap`` or ``memoryview``).
"""

from __future__ import annotations

import functools
import mmap
import socket
import struct
import zlib
from typing import NamedTuple

# The buffers the decoders read and the encoders write (the docstring's list).
ReadBuffer = bytes | bytearray | memoryview | mmap.mmap
WriteBuffer = bytearray | memoryview | mmap.mmap

# --------------------------------------------------------------------------
# CommitLog record (S/MessageExtEncoder.java, S/CommitLog.java)
#
#   0               4               8               12              16
#   +---------------+---------------+---------------+---------------+
#   | TOTALSIZE i32 | MAGICCODE u32 | BODYCRC i32   | QUEUEID i32   |
#   +---------------+---------------+---------------+---------------+
#   | FLAG i32      | QUEUEOFFSET i64               | PHYSICALOFF.. |
#   +---------------+-------------------------------+---------------+
#   | ..SET i64     | SYSFLAG i32   | BORNTIMESTAMP i64             |
#   +---------------+---------------+-------------------------------+
#   | BORNHOST ip4  | BORNHOST port | STORETIMESTAMP i64            |
#   +---------------+---------------+-------------------------------+
#   | STOREHOST ip4 | STOREHOST port| RECONSUMETIMES| PREPARED_TX.. |
#   +---------------+---------------+---------------+---------------+
#   | ..OFFSET i64  |  84 bytes of fixed header end here
#   +---------------+
#   | BODYLEN i32 | BODY ... | TOPICLEN u8 (v1) or u16 (v2) | TOPIC ... |
#   | PROPLEN u16 | PROPERTIES "name\x01value\x02..." |
#
#   4+4+4+4+4+8+8+4+8+(4+4)+8+(4+4)+4+8 = 84; with BODYLEN (4), TOPICLEN (1)
#   and PROPLEN (2) the fixed overhead of a v1 IPv4 record is 91 bytes.
#
#   An IPv6 host (SYSFLAG 0x10 for BORNHOST, 0x20 for STOREHOST) is 16 bytes of
#   address and the port: 20 bytes instead of 8, and every field after it moves
#   12 bytes on (MessageExtEncoder#calMsgLength). SYSFLAG, at 36, comes before
#   both hosts, so it says which header struct reads the rest:
#
#   | ... SYSFLAG | BORNTIMESTAMP | BORNHOST ip6 (16) | port | STORETIMESTAMP |
#   | STOREHOST ip6 (16) | port | RECONSUMETIMES | PREPARED_TX_OFFSET | BODYLEN ...
# --------------------------------------------------------------------------

RECORD_HEADER = struct.Struct(">iIiiiqqiq4siq4siiq")
BODY_LEN = struct.Struct(">i")
TOPIC_LEN_V1 = struct.Struct(">B")
TOPIC_LEN_V2 = struct.Struct(">H")
PROPERTIES_LEN = struct.Struct(">H")
TOTAL_SIZE_AND_MAGIC = struct.Struct(">iI")

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
MAGIC_BLANK = 0xCBD43194

END_FILE_MIN_BLANK_BYTES = 8
TOPIC_V1_MAX_BYTES = 127
PROPERTIES_MAX_BYTES = 32767

QUEUE_OFFSET_POSITION = 20
PHYSICAL_OFFSET_POSITION = 28
STORE_TIMESTAMP_POSITION = 56
BODY_LEN_POSITION = 84

# SYSFLAG bits (C/sysflag/MessageSysFlag.java).
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20
SYSFLAG_HOSTS_V6 = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_COMMIT = 0x8
SYSFLAG_TRANSACTION_ROLLBACK = 0xC

SYS_FLAG = struct.Struct(">i")
SYS_FLAG_POSITION = 36
IPV4_BYTES = 4
IPV6_BYTES = 16
HOST_V6_EXTRA_BYTES = IPV6_BYTES - IPV4_BYTES


def _header_for(sys_flag: int) -> struct.Struct:
    born = IPV6_BYTES if sys_flag & SYSFLAG_BORNHOST_V6 else IPV4_BYTES
    store = IPV6_BYTES if sys_flag & SYSFLAG_STOREHOST_V6 else IPV4_BYTES
    return struct.Struct(f">iIiiiqqiq{born}siq{store}siiq")


# The header struct for each combination of the two host bits (``record_header``).
_RECORD_HEADERS = {bits: _header_for(bits) for bits in (0, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6,
                                                       SYSFLAG_HOSTS_V6)}
assert _RECORD_HEADERS[0].format == RECORD_HEADER.format
assert _RECORD_HEADERS[SYSFLAG_HOSTS_V6].size == RECORD_HEADER.size + 2 * HOST_V6_EXTRA_BYTES


def record_header(sys_flag: int) -> struct.Struct:
    """The fixed header of a record with this SYSFLAG: 84 bytes, 12 more per IPv6 host."""
    return _RECORD_HEADERS[sys_flag & SYSFLAG_HOSTS_V6]


def store_timestamp_position(sys_flag: int) -> int:
    """Where STORETIMESTAMP lies: after an IPv6 born host it is 12 bytes further on."""
    return STORE_TIMESTAMP_POSITION + (HOST_V6_EXTRA_BYTES if sys_flag & SYSFLAG_BORNHOST_V6 else 0)


def host_flags(born_host: HostAddress, store_host: HostAddress) -> int:
    """The SYSFLAG bits that say which of the two hosts are IPv6."""
    return ((SYSFLAG_BORNHOST_V6 if len(born_host.ip) == IPV6_BYTES else 0)
            | (SYSFLAG_STOREHOST_V6 if len(store_host.ip) == IPV6_BYTES else 0))


NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_WAIT = "WAIT"
PROPERTY_CRC32 = "__CRC32#"
KEY_SEPARATOR = " "

# The whole-record CRC property: "__CRC32#" \x01 ten digits \x02
# (MessageDecoder#createCrc32). It covers the record minus these 20 bytes.
CRC32_RESERVED_BYTES = len(PROPERTY_CRC32) + 1 + 10 + 1
CRC32_PROPERTY_PREFIX = (PROPERTY_CRC32 + NAME_VALUE_SEPARATOR).encode()

assert RECORD_HEADER.size == 84
assert RECORD_HEADER.size + BODY_LEN.size + TOPIC_LEN_V1.size + PROPERTIES_LEN.size == 91
assert CRC32_RESERVED_BYTES == 20


def crc32_masked(data: bytes | bytearray | memoryview) -> int:
    """RocketMQ's CRC: zlib CRC-32 masked to a non-negative Java int (UtilAll#crc32)."""
    return zlib.crc32(data) & 0x7FFFFFFF


def crc32_property_digits(crc: int) -> bytes:
    """Ten ASCII digits, least-significant first, as MessageDecoder#createCrc32 writes them."""
    assert 0 <= crc <= 0x7FFFFFFF
    out = bytearray(10)
    for i in range(10):
        out[i] = 0x30 + crc % 10
        crc //= 10
    return bytes(out)


def crc32_from_digits(digits: bytes | str) -> int | None:
    """Inverse of ``crc32_property_digits``; None when the text is not ten digits."""
    text = digits.decode("ascii", "replace") if isinstance(digits, bytes) else digits
    if len(text) != 10 or not (text.isascii() and text.isdigit()):
        return None
    return int(text[::-1])


def encode_properties(properties: dict[str, str]) -> bytes:
    """``name\\x01value\\x02`` for every entry (MessageDecoder#messageProperties2String)."""
    parts = [f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}" for name, value in properties.items()]
    return "".join(parts).encode("utf-8")


def decode_properties(data: bytes | memoryview) -> dict[str, str]:
    """Parse a properties block as MessageDecoder#string2messageProperties does."""
    text = bytes(data).decode("utf-8", "replace")
    result: dict[str, str] = {}
    for entry in text.split(PROPERTY_SEPARATOR):
        if len(entry) < 3:
            continue
        name, sep, value = entry.partition(NAME_VALUE_SEPARATOR)
        if sep and name and value:
            result[name] = value
    return result


def record_size(*, body_bytes: int, topic_bytes: int, properties_bytes: int, sys_flag: int = 0) -> int:
    """TOTALSIZE of a record (MessageExtEncoder#calMsgLength); ``sys_flag`` says which hosts are IPv6."""
    topic_len_size = TOPIC_LEN_V1.size if topic_bytes <= TOPIC_V1_MAX_BYTES else TOPIC_LEN_V2.size
    return (record_header(sys_flag).size + BODY_LEN.size + body_bytes + topic_len_size + topic_bytes
            + PROPERTIES_LEN.size + properties_bytes)


@functools.lru_cache(maxsize=1024)
def _host_text(ip: bytes, port: int) -> str:
    if len(ip) == IPV6_BYTES:
        return f"[{socket.inet_ntop(socket.AF_INET6, ip)}]:{port}"
    return f"{socket.inet_ntoa(ip)}:{port}"


class HostAddress(NamedTuple):
    """An address and port as RocketMQ stores BORNHOST and STOREHOST: 4 bytes of IPv4 or
    16 of IPv6 (the record's SYSFLAG says which); shown as ``a.b.c.d:port`` or ``[v6]:port``."""

    ip: bytes
    port: int

    @classmethod
    def parse(cls, host: str, port: int) -> HostAddress:
        if ":" in host:
            return cls(socket.inet_pton(socket.AF_INET6, host.strip("[]")), port)
        return cls(socket.inet_aton(host), port)

    def __str__(self) -> str:
        return _host_text(self.ip, self.port)


class RecordFields(NamedTuple):
    """What the writer supplies to encode one record; offsets are patched in at append."""

    topic: bytes
    queue_id: int
    body: bytes | memoryview
    properties: bytes  # encoded user properties, without the CRC property
    flag: int
    born_timestamp_ms: int
    born_host: HostAddress
    sys_flag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


def encoded_size(fields: RecordFields, *, with_record_crc: bool, store_host_v6: bool = False) -> int:
    extra = CRC32_RESERVED_BYTES if with_record_crc else 0
    sys_flag = (SYSFLAG_BORNHOST_V6 if len(fields.born_host.ip) == IPV6_BYTES else 0) \
        | (SYSFLAG_STOREHOST_V6 if store_host_v6 else 0)
    return record_size(body_bytes=len(fields.body), topic_bytes=len(fields.topic),
                       properties_bytes=len(fields.properties) + extra, sys_flag=sys_flag)


def encode_record_into(buf: WriteBuffer, pos: int, fields: RecordFields, *,
                       queue_offset: int, commit_log_offset: int, store_timestamp_ms: int,
                       store_host: HostAddress, with_record_crc: bool) -> int:
    """Write one complete record at ``buf[pos:]`` and return its TOTALSIZE."""
    topic_bytes = len(fields.topic)
    body_bytes = len(fields.body)
    props_bytes = len(fields.properties) + (CRC32_RESERVED_BYTES if with_record_crc else 0)
    sys_flag = (fields.sys_flag & ~SYSFLAG_HOSTS_V6) | host_flags(fields.born_host, store_host)
    size = record_size(body_bytes=body_bytes, topic_bytes=topic_bytes, properties_bytes=props_bytes,
                       sys_flag=sys_flag)
    v2 = topic_bytes > TOPIC_V1_MAX_BYTES
    header = record_header(sys_flag)
    header.pack_into(
        buf, pos, size, MAGIC_V2 if v2 else MAGIC_V1, crc32_masked(fields.body), fields.queue_id,
        fields.flag, queue_offset, commit_log_offset, sys_flag, fields.born_timestamp_ms,
        fields.born_host.ip, fields.born_host.port, store_timestamp_ms, store_host.ip, store_host.port,
        fields.reconsume_times, fields.prepared_transaction_offset)
    at = pos + header.size
    BODY_LEN.pack_into(buf, at, body_bytes)
    at += BODY_LEN.size
    buf[at:at + body_bytes] = fields.body
    at += body_bytes
    (TOPIC_LEN_V2 if v2 else TOPIC_LEN_V1).pack_into(buf, at, topic_bytes)
    at += TOPIC_LEN_V2.size if v2 else TOPIC_LEN_V1.size
    buf[at:at + topic_bytes] = fields.topic
    at += topic_bytes
    PROPERTIES_LEN.pack_into(buf, at, props_bytes)
    at += PROPERTIES_LEN.size
    buf[at:at + len(fields.properties)] = fields.properties
    at += len(fields.properties)
    if with_record_crc:
        crc = crc32_masked(memoryview(buf)[pos:pos + size - CRC32_RESERVED_BYTES])
        end = at + CRC32_RESERVED_BYTES
        buf[at:end] = CRC32_PROPERTY_PREFIX + crc32_property_digits(crc) + PROPERTY_SEPARATOR.encode()
        at = end
    assert at == pos + size, (at, pos, size)
    return size


def encode_record(fields: RecordFields, *, queue_offset: int, commit_log_offset: int,
                  store_timestamp_ms: int, store_host: HostAddress, with_record_crc: bool = True) -> bytes:
    """Encode one record into new bytes (tests and tools; the writer encodes in place)."""
    buf = bytearray(encoded_size(fields, with_record_crc=with_record_crc,
                                 store_host_v6=len(store_host.ip) == IPV6_BYTES))
    encode_record_into(buf, 0, fields, queue_offset=queue_offset, commit_log_offset=commit_log_offset,
                       store_timestamp_ms=store_timestamp_ms, store_host=store_host,
                       with_record_crc=with_record_crc)
    return bytes(buf)


def encode_blank(buf: WriteBuffer, pos: int, remaining: int) -> None:
    """The end-of-file marker: [TOTALSIZE = remaining][BLANK magic] (doAppend END_OF_FILE)."""
    assert remaining >= END_FILE_MIN_BLANK_BYTES
    TOTAL_SIZE_AND_MAGIC.pack_into(buf, pos, remaining, MAGIC_BLANK)


class Record(NamedTuple):
    """A decoded CommitLog record. ``body`` is a zero-copy slice of the buffer."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    commit_log_offset: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: HostAddress
    store_timestamp_ms: int
    store_host: HostAddress
    reconsume_times: int
    prepared_transaction_offset: int
    body: memoryview
    topic: str
    properties: dict[str, str]
    properties_raw: memoryview

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def msg_id(self) -> str:
        return encode_msg_id(self.store_host, self.commit_log_offset)

    def user_properties(self) -> dict[str, str]:
        hidden = (PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_CRC32)
        return {k: v for k, v in self.properties.items() if k not in hidden}


# Reasons that say no record starts at the offset (an id pointing inside a record, at a blank
# or at zeros, or into a segment retention removed), where the others say a record is there
# (its magic and PHYSICALOFFSET agree) and is damaged.
NO_RECORD_REASONS = frozenset({"truncated header", "bad magic", "physical offset mismatch",
                               "no segment holds this offset"})


class RecordError(ValueError):
    """A record failed a structural or CRC check; ``reason`` says which."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"{reason} at commit log offset {offset}")
        self.reason = reason
        self.offset = offset

    @property
    def damaged(self) -> bool:
        """A record starts here and fails a check (MESSAGE_CORRUPT), rather than none starting here."""
        return self.reason not in NO_RECORD_REASONS


# The fixed header's fields as ``record_header(sys_flag).unpack_from`` returns them: the hosts'
# ips are bytes (4 or 16), every other field an int, in the order of the drawing above.
RecordHeaderFields = tuple[int, int, int, int, int, int, int, int, int, bytes, int, int, bytes, int, int, int]


class _Layout(NamedTuple):
    """Where the variable parts of a structurally valid record lie."""

    header: RecordHeaderFields
    body_at: int
    body_len: int
    topic_at: int
    topic_len: int
    props_at: int
    props_len: int


def _layout(buf: ReadBuffer, pos: int, limit: int, here: int) -> _Layout:
    """Check every length and fixed field of the record at ``pos``; RecordError if any is wrong."""
    if pos + SYS_FLAG_POSITION + SYS_FLAG.size > limit:
        raise RecordError("truncated header", here)
    (sys_flag,) = SYS_FLAG.unpack_from(buf, pos + SYS_FLAG_POSITION)
    header_struct = record_header(sys_flag)
    if pos + header_struct.size + BODY_LEN.size > limit:
        raise RecordError("truncated header", here)
    header: RecordHeaderFields = header_struct.unpack_from(buf, pos)
    size, magic, _body_crc, _queue_id, _flag, _queue_offset, commit_log_offset = header[:7]
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise RecordError("bad magic", here)
    if size < header_struct.size + 7 or pos + size > limit:
        raise RecordError("bad total size", here)
    if commit_log_offset != here:
        raise RecordError("physical offset mismatch", here)
    end = pos + size
    body_at = pos + header_struct.size + BODY_LEN.size
    (body_len,) = BODY_LEN.unpack_from(buf, body_at - BODY_LEN.size)
    topic_len_struct = TOPIC_LEN_V2 if magic == MAGIC_V2 else TOPIC_LEN_V1
    at = body_at + body_len
    if body_len < 0 or at + topic_len_struct.size > end:
        raise RecordError("bad body length", here)
    (topic_len,) = topic_len_struct.unpack_from(buf, at)
    topic_at = at + topic_len_struct.size
    at = topic_at + topic_len
    if at + PROPERTIES_LEN.size > end:
        raise RecordError("bad topic length", here)
    (props_len,) = PROPERTIES_LEN.unpack_from(buf, at)
    props_at = at + PROPERTIES_LEN.size
    if props_at + props_len != end:
        raise RecordError("length fields disagree with total size", here)
    return _Layout(header, body_at, body_len, topic_at, topic_len, props_at, props_len)


def _verify_crcs(view: memoryview, pos: int, parts: _Layout, here: int, *, require_record_crc: bool) -> None:
    """The record CRC, when present, covers the body and its BODYCRC field: one pass is enough."""
    size, body_crc = parts.header[0], parts.header[2]
    props_raw = view[parts.props_at:parts.props_at + parts.props_len]
    if not _check_record_crc(view, pos, size, props_raw, here):
        if require_record_crc:
            raise RecordError("record CRC property missing", here)
        if crc32_masked(view[parts.body_at:parts.body_at + parts.body_len]) != body_crc:
            raise RecordError("body CRC mismatch", here)


def _topic(view: memoryview, parts: _Layout, here: int) -> str:
    try:
        return bytes(view[parts.topic_at:parts.topic_at + parts.topic_len]).decode("utf-8")
    except UnicodeDecodeError:
        raise RecordError("topic is not UTF-8", here) from None


def decode_record(buf: ReadBuffer, pos: int, *, limit: int,
                  base_offset: int = 0, check_crc: bool = True, require_record_crc: bool = False) -> Record:
    """Decode and verify the record at ``buf[pos:]``; ``limit`` bounds what may be read.

    ``base_offset`` is the commit log offset of ``buf[0]``, so the record's
    PHYSICALOFFSET can be checked against where it really is. With
    ``require_record_crc`` a record without the ``__CRC32#`` property fails
    (a torn write that zeroed it must not pass as a record without one). Raises
    ``RecordError`` on any inconsistency: a damaged record is never returned.
    """
    here = base_offset + pos
    parts = _layout(buf, pos, limit, here)
    view = memoryview(buf)
    if check_crc:
        _verify_crcs(view, pos, parts, here, require_record_crc=require_record_crc)
    (size, magic, body_crc, queue_id, flag, queue_offset, commit_log_offset, sys_flag, born_ts,
     born_ip, born_port, store_ts, store_ip, store_port, reconsume, prepared) = parts.header
    props_raw = view[parts.props_at:parts.props_at + parts.props_len]
    return Record(size, magic, body_crc, queue_id, flag, queue_offset, commit_log_offset, sys_flag, born_ts,
                  HostAddress(born_ip, born_port), store_ts, HostAddress(store_ip, store_port), reconsume, prepared,
                  view[parts.body_at:parts.body_at + parts.body_len], _topic(view, parts, here),
                  decode_properties(props_raw), props_raw)


class RecordHead(NamedTuple):
    """What recovery needs of a verified record, without decoding its properties."""

    total_size: int
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_timestamp_ms: int
    topic: str


def verify_record(buf: ReadBuffer, pos: int, *, limit: int, base_offset: int = 0,
                  require_record_crc: bool = False) -> RecordHead:
    """Check one record as ``decode_record`` does, but return only its head (no properties)."""
    here = base_offset + pos
    parts = _layout(buf, pos, limit, here)
    view = memoryview(buf)
    _verify_crcs(view, pos, parts, here, require_record_crc=require_record_crc)
    header = parts.header
    return RecordHead(header[0], header[3], header[5], header[6], header[11], _topic(view, parts, here))


def _check_record_crc(view: memoryview, pos: int, size: int, props_raw: memoryview, here: int) -> bool:
    """Verify the ``__CRC32#`` property if the record ends with one; False if it has none."""
    if len(props_raw) < CRC32_RESERVED_BYTES:
        return False
    tail = bytes(props_raw[len(props_raw) - CRC32_RESERVED_BYTES:])
    if not tail.startswith(CRC32_PROPERTY_PREFIX):
        # No CRC property, unless a damaged one: its shape (\x01, ten digits, \x02) is still there.
        name_damage = sum(a != b for a, b in zip(tail[:8], CRC32_PROPERTY_PREFIX, strict=False))
        if tail[-1:] == b"\x02" and tail[9:19].isdigit() and name_damage <= 2:
            raise RecordError("record CRC property name damaged", here)
        return False
    expected = crc32_from_digits(tail[len(CRC32_PROPERTY_PREFIX):-1])
    if expected is None or tail[-1:] != PROPERTY_SEPARATOR.encode():
        raise RecordError("record CRC property malformed", here)
    if crc32_masked(view[pos:pos + size - CRC32_RESERVED_BYTES]) != expected:
        raise RecordError("record CRC mismatch", here)
    return True


def peek_size_and_magic(buf: ReadBuffer, pos: int) -> tuple[int, int]:
    """TOTALSIZE and MAGICCODE at ``pos`` without any check."""
    return TOTAL_SIZE_AND_MAGIC.unpack_from(buf, pos)


# --------------------------------------------------------------------------
# Message id: offsetMsgId (MessageDecoder#createMessageId)
#
#   +----------------+------------+---------------------------+
#   | store ip (4)   | port i32   | commit log offset i64     |   16 bytes,
#   +----------------+------------+---------------------------+   32 hex chars
# --------------------------------------------------------------------------

MSG_ID = struct.Struct(">4siq")
MSG_ID_V6 = struct.Struct(">16siq")  # an IPv6 store host: 28 bytes, 56 hex chars
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
assert MSG_ID.size == 16
assert MSG_ID_V6.size == 28


def encode_msg_id(store_host: HostAddress, commit_log_offset: int) -> str:
    layout = MSG_ID_V6 if len(store_host.ip) == IPV6_BYTES else MSG_ID
    return layout.pack(store_host.ip, store_host.port, commit_log_offset).hex().upper()


def decode_msg_id(msg_id: str) -> tuple[HostAddress, int]:
    """Split an offsetMsgId into its store host and commit log offset; ValueError if malformed.

    The offset may be negative (an id is 16 bytes of anything): a caller decoding a request's
    id checks it, with its own error code, before any storage code sees it."""
    layout = MSG_ID_V6 if len(msg_id) == 2 * MSG_ID_V6.size else MSG_ID
    if len(msg_id) != 2 * layout.size or not all(c in _HEX_DIGITS for c in msg_id):
        raise ValueError(f"a message id is {2 * MSG_ID.size} (or, with an IPv6 store host, "
                         f"{2 * MSG_ID_V6.size}) hex digits, got {msg_id!r}")
    ip, port, offset = layout.unpack(bytes.fromhex(msg_id))
    return HostAddress(ip, port), offset


# --------------------------------------------------------------------------
# ConsumeQueue unit (S/ConsumeQueue.java, CQ_STORE_UNIT_SIZE = 20)
#
#   +-------------------------------+---------------+-------------------------------+
#   | commit log offset i64         | size i32      | tags code i64                 |
#   +-------------------------------+---------------+-------------------------------+
#   8 + 4 + 8 = 20 bytes; queue offset n lives at byte n * 20.
# --------------------------------------------------------------------------

CQ_UNIT = struct.Struct(">qiq")
CQ_UNIT_BYTES = CQ_UNIT.size
assert CQ_UNIT_BYTES == 20


# --------------------------------------------------------------------------
# IndexFile (S/index/IndexFile.java, IndexHeader.java)
#
#   header, 40 bytes:
#   +-----------------------+-----------------------+-----------------------+
#   | begin timestamp i64   | end timestamp i64     | begin phy offset i64  |
#   +-----------------------+-----------+-----------+-----------------------+
#   | end phy offset i64    | slots i32 | count i32 |   count starts at 1
#   +-----------------------+-----------+-----------+
#   then hash_slot_count x i32 (newest item number in the bucket, 0 = empty),
#   then index_count x item, 20 bytes each:
#   +-----------+-----------------------+-----------+-----------+
#   | hash i32  | commit log offset i64 | tdiff i32 | prev i32  |   tdiff in seconds
#   +-----------+-----------------------+-----------+-----------+
# --------------------------------------------------------------------------

INDEX_HEADER = struct.Struct(">qqqqii")
INDEX_SLOT = struct.Struct(">i")
INDEX_ITEM = struct.Struct(">iqii")
assert INDEX_HEADER.size == 40
assert INDEX_SLOT.size == 4
assert INDEX_ITEM.size == 20


def index_file_bytes(*, hash_slot_count: int, index_count: int) -> int:
    return INDEX_HEADER.size + hash_slot_count * INDEX_SLOT.size + index_count * INDEX_ITEM.size


def java_string_hash(text: str) -> int:
    """Java ``String.hashCode`` (over UTF-16 code units) as a signed 32-bit int.

    The sum is reduced mod 2**32 once at the end: Python's integers do not
    overflow, and one mask is cheaper than one per character.
    """
    h = 0
    if text.isascii():
        for unit in text.encode("ascii"):
            h = 31 * h + unit
    else:
        data = text.encode("utf-16-be")
        for i in range(0, len(data), 2):
            h = 31 * h + ((data[i] << 8) | data[i + 1])
    h &= 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def index_key_hash(key: str) -> int:
    """IndexFile#indexKeyHashMethod: abs(hashCode), with Integer.MIN_VALUE mapped to 0."""
    h = java_string_hash(key)
    return 0 if h == -0x80000000 else abs(h)


def tags_code(tags: str | None) -> int:
    """The ConsumeQueue tags code: Java String.hashCode of the tag, 0 without one."""
    return java_string_hash(tags) if tags else 0


# --------------------------------------------------------------------------
# Checkpoint (S/StoreCheckpoint.java): a 4 KiB file.
#
#   0                       8                       16                      24
#   +-----------------------+-----------------------+-----------------------+
#   | physicMsgTimestamp    | logicsMsgTimestamp    | indexMsgTimestamp     |
#   +-----------------------+-----------------------+-----------------------+
#   | masterFlushedOffset   | confirmPhyOffset      |   40 bytes: RocketMQ's
#   +-----------------------+-----------------------+
#   ... zeros ...
#   4064: our extension, which RocketMQ's reader ignores:
#   +-----------+-----------+-----------------------+-----------------------+
#   | magic u32 | version   | flushed offset i64    | dispatched offset i64 |
#   +-----------+-----------+-----------------------+-----------------------+
#   | reserved (4)          | crc32 u32 over bytes 0..40 and 4064..4092     |
#   +-----------------------+-----------+
# --------------------------------------------------------------------------

CHECKPOINT_FILE_BYTES = 4096
CHECKPOINT = struct.Struct(">qqqqq")
CHECKPOINT_EXT = struct.Struct(">IIqqi")
CHECKPOINT_CRC = struct.Struct(">I")
CHECKPOINT_EXT_POSITION = 4064
CHECKPOINT_CRC_POSITION = CHECKPOINT_EXT_POSITION + CHECKPOINT_EXT.size
CHECKPOINT_EXT_MAGIC = 0x524D5143  # "RMQC"
CHECKPOINT_EXT_VERSION = 1
assert CHECKPOINT.size == 40
assert CHECKPOINT_EXT.size == 28
assert CHECKPOINT_CRC_POSITION + CHECKPOINT_CRC.size == CHECKPOINT_FILE_BYTES


# --------------------------------------------------------------------------
# File names: 20-digit zero-padded start offsets (UtilAll#offset2FileName).
# --------------------------------------------------------------------------

def offset_to_file_name(offset: int) -> str:
    assert offset >= 0
    return f"{offset:020d}"


def file_name_to_offset(name: str) -> int | None:
    if len(name) != 20 or not (name.isascii() and name.isdigit()):
        return None
    return int(name)
