"""Golden-byte tests for the CommitLog record format (reference section 1).

The expected bytes are built here by hand, field by field, from the reference
(shared/reference/rocketmq-store.md section 1.1, 1.3, 1.4), never from
engine.layout's own struct definitions; the engine's output is then compared
to them and decoded back.
"""

from __future__ import annotations

import struct
import zlib

import pytest

from engine import codec_py
from engine.codec import read_view
from engine.layout import (
    HostAddress,
    RecordError,
    RecordFields,
    crc32_from_digits,
    crc32_property_digits,
    decode_properties,
    decode_record,
    encode_blank,
    encode_properties,
    encode_record,
    encoded_size,
    peek_size_and_magic,
)

pytestmark = pytest.mark.timeout(30)

# --- the known record --------------------------------------------------------

TOPIC = b"TopicTest"
QUEUE_ID = 3
FLAG = 7
BODY = b"Hello RocketMQ"
UNIQ = "0A0000011F9018B4AAC2134DEA9C0000"  # 32 hex characters
assert len(UNIQ) == 32
QUEUE_OFFSET = 42
COMMIT_LOG_OFFSET = 1000
BORN_TS = 1_700_000_000_123
STORE_TS = 1_700_000_000_456
RECONSUME_TIMES = 2
BORN_HOST = HostAddress.parse("10.0.0.1", 51234)
STORE_HOST = HostAddress.parse("127.0.0.1", 10911)

# name \x01 value \x02, in insertion order (MessageDecoder#messageProperties2String)
PROPS = (b"TAGS" + b"\x01" + b"TagA" + b"\x02"
         + b"KEYS" + b"\x01" + b"k1 k2" + b"\x02"
         + b"UNIQ_KEY" + b"\x01" + UNIQ.encode() + b"\x02")
PROPS_DICT = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": UNIQ}

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
MAGIC_BLANK = 0xCBD43194


def _fields(topic: bytes = TOPIC, body: bytes = BODY, props: bytes = PROPS) -> RecordFields:
    return RecordFields(topic=topic, queue_id=QUEUE_ID, body=body, properties=props, flag=FLAG,
                        born_timestamp_ms=BORN_TS, born_host=BORN_HOST, sys_flag=0,
                        reconsume_times=RECONSUME_TIMES, prepared_transaction_offset=0)


def _encode(fields: RecordFields, *, with_record_crc: bool) -> bytes:
    return encode_record(fields, queue_offset=QUEUE_OFFSET, commit_log_offset=COMMIT_LOG_OFFSET,
                         store_timestamp_ms=STORE_TS, store_host=STORE_HOST, with_record_crc=with_record_crc)


def hand_built_record(*, topic: bytes = TOPIC, body: bytes = BODY, user_props: bytes = PROPS,
                      with_record_crc: bool) -> bytes:
    """The record exactly as section 1.1 lays it out, one field per line."""
    v2 = len(topic) > 127
    topic_len_field = struct.pack(">H", len(topic)) if v2 else struct.pack(">B", len(topic))
    prop_len = len(user_props) + (20 if with_record_crc else 0)
    total = (4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8   # 84 fixed header bytes
             + 4 + len(body) + len(topic_len_field) + len(topic) + 2 + prop_len)
    out = b"".join([
        struct.pack(">i", total),                                   # 1  TOTALSIZE
        struct.pack(">I", MAGIC_V2 if v2 else MAGIC_V1),            # 2  MAGICCODE
        struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF),           # 3  BODYCRC
        struct.pack(">i", QUEUE_ID),                                # 4  QUEUEID
        struct.pack(">i", FLAG),                                    # 5  FLAG
        struct.pack(">q", QUEUE_OFFSET),                            # 6  QUEUEOFFSET
        struct.pack(">q", COMMIT_LOG_OFFSET),                       # 7  PHYSICALOFFSET
        struct.pack(">i", 0),                                       # 8  SYSFLAG
        struct.pack(">q", BORN_TS),                                 # 9  BORNTIMESTAMP
        bytes([10, 0, 0, 1]) + struct.pack(">i", 51234),            # 10 BORNHOST ip4 + port
        struct.pack(">q", STORE_TS),                                # 11 STORETIMESTAMP
        bytes([127, 0, 0, 1]) + struct.pack(">i", 10911),           # 12 STOREHOSTADDRESS
        struct.pack(">i", RECONSUME_TIMES),                         # 13 RECONSUMETIMES
        struct.pack(">q", 0),                                       # 14 PREPARED TX OFFSET
        struct.pack(">i", len(body)), body,                         # 15 BODYLEN + BODY
        topic_len_field, topic,                                     # 16 TOPICLEN + TOPIC
        struct.pack(">H", prop_len), user_props,                    # 17 PROPLEN + PROPERTIES
    ])
    if with_record_crc:
        # __CRC32# \x01 ten digits least-significant first \x02 over the record minus these 20 bytes
        crc = zlib.crc32(out) & 0x7FFFFFFF
        digits = str(crc).zfill(10)[::-1].encode()
        out += b"__CRC32#" + b"\x01" + digits + b"\x02"
    assert len(out) == total
    return out


# --- encoding ------------------------------------------------------------------

def test_properties_literal_matches_encoder():
    assert encode_properties(PROPS_DICT) == PROPS
    assert len(PROPS) == 10 + 11 + 42


def test_record_without_crc_matches_hand_built_bytes():
    encoded = _encode(_fields(), with_record_crc=False)
    expected = hand_built_record(with_record_crc=False)
    assert encoded == expected
    # TOTALSIZE = 91 + body + topic + properties
    assert len(encoded) == 91 + len(BODY) + len(TOPIC) + len(PROPS) == 177
    assert encoded_size(_fields(), with_record_crc=False) == 177


def test_record_header_golden_hex():
    """The same header once more as literal hex, read off the reference table."""
    encoded = _encode(_fields(), with_record_crc=False)
    body_crc = zlib.crc32(BODY) & 0x7FFFFFFF
    golden_header = bytes.fromhex(
        "000000B1"                    # TOTALSIZE 177
        "DAA320A7"                    # MAGICCODE v1
        f"{body_crc:08X}"             # BODYCRC
        "00000003"                    # QUEUEID 3
        "00000007"                    # FLAG 7
        "000000000000002A"            # QUEUEOFFSET 42
        "00000000000003E8"            # PHYSICALOFFSET 1000
        "00000000"                    # SYSFLAG
        f"{BORN_TS:016X}"             # BORNTIMESTAMP
        "0A000001" "0000C822"         # BORNHOST 10.0.0.1:51234
        f"{STORE_TS:016X}"            # STORETIMESTAMP
        "7F000001" "00002A9F"         # STOREHOST 127.0.0.1:10911
        "00000002"                    # RECONSUMETIMES
        "0000000000000000"            # PREPARED TX OFFSET
        "0000000E"                    # BODYLEN 14
    )
    assert encoded[:88] == golden_header
    # positions named in the reference
    assert struct.unpack_from(">q", encoded, 20)[0] == QUEUE_OFFSET
    assert struct.unpack_from(">q", encoded, 28)[0] == COMMIT_LOG_OFFSET
    assert struct.unpack_from(">i", encoded, 36)[0] == 0
    assert struct.unpack_from(">q", encoded, 56)[0] == STORE_TS
    assert encoded[88:88 + 14] == BODY
    assert encoded[102] == 9 and encoded[103:112] == TOPIC          # TOPICLEN (1 byte) + TOPIC
    assert encoded[112:114] == b"\x00\x3F" and encoded[114:] == PROPS  # PROPLEN 63 + PROPERTIES


def test_record_with_crc_matches_hand_built_bytes():
    encoded = _encode(_fields(), with_record_crc=True)
    assert encoded == hand_built_record(with_record_crc=True)
    assert len(encoded) == 91 + len(BODY) + len(TOPIC) + len(PROPS) + 20
    # PROPLEN counts the 20 CRC bytes
    prop_len_at = 84 + 4 + len(BODY) + 1 + len(TOPIC)
    assert struct.unpack_from(">H", encoded, prop_len_at)[0] == len(PROPS) + 20
    tail = encoded[-20:]
    assert tail[:9] == b"__CRC32#\x01" and tail[-1:] == b"\x02"
    digits = tail[9:19]
    assert digits.isdigit() and len(digits) == 10
    crc = zlib.crc32(encoded[:-20]) & 0x7FFFFFFF
    assert int(digits[::-1]) == crc
    # the user properties come first, unchanged
    assert encoded[prop_len_at + 2:prop_len_at + 2 + len(PROPS)] == PROPS


def test_v1_topic_of_127_bytes_keeps_one_byte_length():
    topic = b"T" * 127
    encoded = _encode(_fields(topic=topic), with_record_crc=False)
    assert encoded == hand_built_record(topic=topic, with_record_crc=False)
    assert struct.unpack_from(">I", encoded, 4)[0] == MAGIC_V1
    assert encoded[88 + len(BODY)] == 127


def test_v2_magic_and_two_byte_topic_length_for_long_topics():
    topic = b"T" * 128
    encoded = _encode(_fields(topic=topic), with_record_crc=False)
    assert encoded == hand_built_record(topic=topic, with_record_crc=False)
    assert struct.unpack_from(">I", encoded, 4)[0] == MAGIC_V2 == 0xDAA320AB
    at = 88 + len(BODY)
    assert encoded[at:at + 2] == b"\x00\x80"      # TOPICLEN u16 = 128
    assert encoded[at + 2:at + 2 + 128] == topic
    assert len(encoded) == 92 + len(BODY) + 128 + len(PROPS)

    topic = b"t" * 300
    encoded = _encode(_fields(topic=topic), with_record_crc=True)
    assert encoded == hand_built_record(topic=topic, with_record_crc=True)
    record = decode_record(encoded, 0, limit=len(encoded), base_offset=COMMIT_LOG_OFFSET)
    assert record.magic == MAGIC_V2
    assert record.topic == "t" * 300
    assert bytes(record.body) == BODY
    assert record.properties["__CRC32#"].isdigit()


# --- decoding --------------------------------------------------------------------

@pytest.mark.parametrize("with_record_crc", [False, True])
def test_decode_round_trips_every_field(with_record_crc):
    encoded = _encode(_fields(), with_record_crc=with_record_crc)
    record = decode_record(encoded, 0, limit=len(encoded), base_offset=COMMIT_LOG_OFFSET)
    assert record.total_size == len(encoded)
    assert record.magic == MAGIC_V1
    assert record.body_crc == zlib.crc32(BODY) & 0x7FFFFFFF
    assert record.queue_id == QUEUE_ID
    assert record.flag == FLAG
    assert record.queue_offset == QUEUE_OFFSET
    assert record.commit_log_offset == COMMIT_LOG_OFFSET
    assert record.sys_flag == 0
    assert record.born_timestamp_ms == BORN_TS
    assert record.born_host == BORN_HOST and str(record.born_host) == "10.0.0.1:51234"
    assert record.store_timestamp_ms == STORE_TS
    assert record.store_host == STORE_HOST and str(record.store_host) == "127.0.0.1:10911"
    assert record.reconsume_times == RECONSUME_TIMES
    assert record.prepared_transaction_offset == 0
    assert bytes(record.body) == BODY
    assert record.topic == "TopicTest"
    assert record.tags == "TagA"
    assert record.keys == ["k1", "k2"]
    assert record.uniq_key == UNIQ
    assert record.user_properties() == {"UNIQ_KEY": UNIQ}
    assert record.msg_id == "7F00000100002A9F00000000000003E8"
    if with_record_crc:
        assert set(record.properties) == {"TAGS", "KEYS", "UNIQ_KEY", "__CRC32#"}
        assert bytes(record.properties_raw) == PROPS + encoded[-20:]
    else:
        assert record.properties == PROPS_DICT
        assert bytes(record.properties_raw) == PROPS


def test_decode_inside_a_larger_buffer_uses_base_offset():
    encoded = _encode(_fields(), with_record_crc=True)
    # the record sits at buffer position 100; buf[0] is commit log offset 900
    buf = bytearray(100) + encoded + bytearray(50)
    record = decode_record(buf, 100, limit=len(buf), base_offset=900)
    assert record.commit_log_offset == 1000
    assert peek_size_and_magic(buf, 100) == (len(encoded), MAGIC_V1)


def test_wrong_physical_offset_raises():
    encoded = _encode(_fields(), with_record_crc=True)
    with pytest.raises(RecordError) as info:
        decode_record(encoded, 0, limit=len(encoded))  # base_offset 0: here is 0, field says 1000
    assert info.value.reason == "physical offset mismatch"
    with pytest.raises(RecordError):
        decode_record(encoded, 0, limit=len(encoded), base_offset=COMMIT_LOG_OFFSET + 1)


@pytest.mark.parametrize("with_record_crc", [False, True])
def test_flipped_body_byte_raises_a_crc_error(with_record_crc):
    encoded = bytearray(_encode(_fields(), with_record_crc=with_record_crc))
    encoded[88 + 3] ^= 0x01  # a byte inside BODY
    with pytest.raises(RecordError) as info:
        decode_record(encoded, 0, limit=len(encoded), base_offset=COMMIT_LOG_OFFSET)
    # The record CRC, when present, covers the body, and is checked first.
    assert info.value.reason == ("record CRC mismatch" if with_record_crc else "body CRC mismatch")
    assert info.value.offset == COMMIT_LOG_OFFSET
    # without CRC checks the structure still parses
    record = decode_record(encoded, 0, limit=len(encoded), base_offset=COMMIT_LOG_OFFSET, check_crc=False)
    assert bytes(record.body) != BODY


def test_flipped_header_byte_raises_with_record_crc():
    encoded = bytearray(_encode(_fields(), with_record_crc=True))
    encoded[15] ^= 0x04  # last byte of QUEUEID (offset 12..16)
    with pytest.raises(RecordError) as info:
        decode_record(encoded, 0, limit=len(encoded), base_offset=COMMIT_LOG_OFFSET)
    assert info.value.reason == "record CRC mismatch"


def test_flipped_header_byte_is_undetected_without_record_crc():
    """RocketMQ's default: only the body is covered, so a QUEUEID flip goes unnoticed."""
    encoded = bytearray(_encode(_fields(), with_record_crc=False))
    encoded[15] ^= 0x04
    record = decode_record(encoded, 0, limit=len(encoded), base_offset=COMMIT_LOG_OFFSET)
    assert record.queue_id == QUEUE_ID ^ 0x04


def test_flipped_crc_digits_raise():
    encoded = bytearray(_encode(_fields(), with_record_crc=True))
    digit_at = len(encoded) - 11  # first CRC digit
    encoded[digit_at] = ord("0") + (encoded[digit_at] - ord("0") + 1) % 10
    with pytest.raises(RecordError) as info:
        decode_record(encoded, 0, limit=len(encoded), base_offset=COMMIT_LOG_OFFSET)
    assert info.value.reason == "record CRC mismatch"
    encoded[digit_at] = ord("x")
    with pytest.raises(RecordError) as info:
        decode_record(encoded, 0, limit=len(encoded), base_offset=COMMIT_LOG_OFFSET)
    assert info.value.reason == "record CRC property malformed"


def test_structural_errors_raise():
    encoded = _encode(_fields(), with_record_crc=True)
    with pytest.raises(RecordError):  # truncated: limit cuts the record
        decode_record(encoded, 0, limit=len(encoded) - 1, base_offset=COMMIT_LOG_OFFSET)
    bad_magic = bytearray(encoded)
    bad_magic[4] ^= 0xFF
    with pytest.raises(RecordError) as info:
        decode_record(bad_magic, 0, limit=len(bad_magic), base_offset=COMMIT_LOG_OFFSET)
    assert info.value.reason == "bad magic"
    bad_size = bytearray(encoded)
    struct.pack_into(">i", bad_size, 0, len(encoded) - 1)
    with pytest.raises(RecordError):
        decode_record(bad_size, 0, limit=len(bad_size), base_offset=COMMIT_LOG_OFFSET)
    with pytest.raises(RecordError):
        decode_record(bytes(40), 0, limit=40)


# --- properties ----------------------------------------------------------------------

def test_properties_encode_decode():
    assert encode_properties({}) == b""
    assert encode_properties({"a": "b"}) == b"a\x01b\x02"
    assert encode_properties({"k": "日本"}) == b"k\x01" + "日本".encode() + b"\x02"
    assert decode_properties(PROPS) == PROPS_DICT
    assert decode_properties(b"a\x01b\x02") == {"a": "b"}
    # a last entry without a trailing separator is still parsed
    assert decode_properties(b"a\x01b\x02cc\x01dd") == {"a": "b", "cc": "dd"}
    assert decode_properties("k\x01日本\x02".encode()) == {"k": "日本"}


def test_decode_properties_ignores_short_and_malformed_entries():
    # segments shorter than 3 characters are skipped: "a\x01" (2), "" (0), "ab" (2)
    assert decode_properties(b"a\x01\x02\x02ab\x02x\x01y\x02") == {"x": "y"}
    # no separator, empty name or empty value: skipped
    assert decode_properties(b"abc\x02\x01bc\x02ab\x01\x02k\x01v\x02") == {"k": "v"}
    assert decode_properties(b"") == {}


# --- the blank end-of-file marker ---------------------------------------------------

def test_blank_marker_bytes():
    buf = bytearray(b"\xAA" * 64)
    encode_blank(buf, 16, 48)
    # [TOTALSIZE = remaining][BLANK magic], big-endian, 8 bytes; nothing else written
    assert bytes(buf[16:24]) == struct.pack(">iI", 48, MAGIC_BLANK) == bytes.fromhex("00000030CBD43194")
    assert bytes(buf[:16]) == b"\xAA" * 16 and bytes(buf[24:]) == b"\xAA" * 40
    assert peek_size_and_magic(buf, 16) == (48, MAGIC_BLANK)

    big = bytearray(70000)
    encode_blank(big, 65536 - 100, 100)
    assert bytes(big[65436:65444]) == bytes.fromhex("00000064CBD43194")


# --- CRC digits ---------------------------------------------------------------------

def test_crc32_property_digits():
    assert crc32_property_digits(1234567890) == b"0987654321"
    assert crc32_property_digits(5) == b"5000000000"
    assert crc32_property_digits(0) == b"0000000000"
    assert crc32_property_digits(120) == b"0210000000"
    assert crc32_property_digits(0x7FFFFFFF) == b"7463847412"  # 2147483647 reversed


def test_crc32_from_digits_inverts():
    for value in (0, 5, 120, 1234567890, 0x7FFFFFFF):
        assert crc32_from_digits(crc32_property_digits(value)) == value
    assert crc32_from_digits("5000000000") == 5
    assert crc32_from_digits(b"123") is None
    assert crc32_from_digits(b"12345678x0") is None


# --- fields this engine does not write itself ------------------------------------------

def hand_built_v6(*, born_v6: bool, store_v6: bool, sys_flag: int, prepared: int) -> bytes:
    """Section 1.1 with IPv6 hosts: 16 address bytes + port (20 instead of 8), SYSFLAG 0x10 / 0x20."""
    born = (bytes(range(1, 17)) if born_v6 else bytes([10, 0, 0, 1])) + struct.pack(">i", 51234)
    store = (bytes(range(0xF0, 0x100)) if store_v6 else bytes([127, 0, 0, 1])) + struct.pack(">i", 10911)
    sys_flag = (sys_flag & ~0x30) | (0x10 if born_v6 else 0) | (0x20 if store_v6 else 0)
    total = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + len(born) + 8 + len(store) + 4 + 8 + 4 + len(BODY) + 1 + len(TOPIC) \
        + 2 + len(PROPS)
    return b"".join([
        struct.pack(">iIiiiqqiq", total, MAGIC_V1, zlib.crc32(BODY) & 0x7FFFFFFF, QUEUE_ID, FLAG, QUEUE_OFFSET,
                    COMMIT_LOG_OFFSET, sys_flag, BORN_TS),
        born, struct.pack(">q", STORE_TS), store, struct.pack(">iq", RECONSUME_TIMES, prepared),
        struct.pack(">i", len(BODY)), BODY, struct.pack(">B", len(TOPIC)), TOPIC, struct.pack(">H", len(PROPS)), PROPS])


@pytest.mark.parametrize("born_v6,store_v6", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("sys_flag", [0, 0x1, 0x2, 0x4, 0x8, 0xC, 0x40, 0x80, 0x300, -1])
def test_every_host_width_and_sysflag_value_decodes_and_encodes_byte_for_byte(born_v6: bool, store_v6: bool,
                                                                              sys_flag: int) -> None:
    """Recovery keeps what passes the CRC and the layout's checks: no field value this engine does not
    write itself (IPv6 hosts, transaction types, compression or batch bits) makes a record damage."""
    expected = hand_built_v6(born_v6=born_v6, store_v6=store_v6, sys_flag=sys_flag, prepared=77)
    born = HostAddress(bytes(range(1, 17)) if born_v6 else bytes([10, 0, 0, 1]), 51234)
    store = HostAddress(bytes(range(0xF0, 0x100)) if store_v6 else bytes([127, 0, 0, 1]), 10911)
    fields = _fields()._replace(born_host=born, sys_flag=sys_flag, prepared_transaction_offset=77)
    encoded = encode_record(fields, queue_offset=QUEUE_OFFSET, commit_log_offset=COMMIT_LOG_OFFSET,
                            store_timestamp_ms=STORE_TS, store_host=store, with_record_crc=False)
    assert encoded == expected
    record = decode_record(expected, 0, limit=len(expected), base_offset=COMMIT_LOG_OFFSET)
    assert (record.born_host, record.store_host, record.store_timestamp_ms) == (born, store, STORE_TS)
    assert (record.reconsume_times, record.prepared_transaction_offset, bytes(record.body)) == \
        (RECONSUME_TIMES, 77, BODY)
    assert record.sys_flag & ~0x30 == sys_flag & ~0x30
    assert len(record.msg_id) == (56 if store_v6 else 32)
    for read in (read_view, codec_py.read_view):
        view = read(expected, 0, len(expected), COMMIT_LOG_OFFSET, True, False)
        assert view is not None and view["msg_id"] == record.msg_id and view["store_host"] == str(store)
