"""Golden-byte tests for the ConsumeQueue unit, Java String.hashCode, the IndexFile
layout, offsetMsgId and file names (reference sections 1.5, 2.1, 3.1, 4).

Expected values are computed here by hand from the reference, then compared to
what engine.layout / engine.store.index_file produce.
"""

from __future__ import annotations

import struct

import pytest

from engine.layout import (
    CQ_UNIT,
    HostAddress,
    decode_msg_id,
    encode_msg_id,
    file_name_to_offset,
    index_key_hash,
    java_string_hash,
    offset_to_file_name,
    tags_code,
)
from engine.store.index_file import IndexFile, IndexService, index_file_ms

pytestmark = pytest.mark.timeout(30)

INT_MIN = -(2 ** 31)


def java_hash_by_hand(code_units: list[int]) -> int:
    """s[0]*31^(n-1) + s[1]*31^(n-2) + ... + s[n-1], wrapped to a signed 32-bit int."""
    n = len(code_units)
    total = sum(unit * 31 ** (n - 1 - i) for i, unit in enumerate(code_units))
    total &= 0xFFFFFFFF
    return total - 2 ** 32 if total >= 2 ** 31 else total


# --- ConsumeQueue unit ----------------------------------------------------------

def test_cq_unit_golden_bytes():
    packed = CQ_UNIT.pack(1000, 177, 2598919)
    assert len(packed) == CQ_UNIT.size == 20
    expected = (
        bytes.fromhex("00000000000003E8")   # commitLogOffset int64 = 1000
        + bytes.fromhex("000000B1")         # msgSize int32 = 177
        + bytes.fromhex("000000000027A807")  # tagsCode int64 = 2598919 ("TagA".hashCode())
    )
    assert packed == expected
    assert CQ_UNIT.unpack(expected) == (1000, 177, 2598919)


def test_cq_unit_negative_tags_code():
    packed = CQ_UNIT.pack(2 ** 40, 0x7FFFFFFF, -1656663421)
    expected = (struct.pack(">q", 2 ** 40)          # commitLogOffset
                + struct.pack(">i", 0x7FFFFFFF)     # msgSize (the blank-unit size)
                + struct.pack(">q", -1656663421))   # tagsCode: sign-extended to 64 bits
    assert packed == expected
    assert packed[12:20] == bytes.fromhex("FFFFFFFF9D415283")
    assert CQ_UNIT.unpack(packed) == (2 ** 40, 0x7FFFFFFF, -1656663421)
    # the smallest tags code (Integer.MIN_VALUE widened to long)
    assert CQ_UNIT.pack(0, 1, INT_MIN)[12:] == bytes.fromhex("FFFFFFFF80000000")


# --- Java String.hashCode ---------------------------------------------------------

def test_java_hash_small_vectors():
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    # "TagA" = 84*31^3 + 97*31^2 + 103*31 + 65
    by_hand = 84 * 29791 + 97 * 961 + 103 * 31 + 65
    assert by_hand == 2598919
    assert java_hash_by_hand([ord(c) for c in "TagA"]) == by_hand
    assert java_string_hash("TagA") == by_hand


def test_java_hash_overflowing_vectors():
    assert java_string_hash("hello") == 99162322
    assert java_hash_by_hand([ord(c) for c in "hello"]) == 99162322
    assert java_string_hash("polygenelubricants") == INT_MIN == -2147483648
    assert java_hash_by_hand([ord(c) for c in "polygenelubricants"]) == INT_MIN
    assert java_string_hash("hello world") == 1794106052
    assert java_string_hash("TopicTest#UNIQ") == -1656663421


def test_java_hash_non_ascii_and_surrogate_pairs():
    # "日本" is two BMP code units, U+65E5 U+672C
    assert java_string_hash("日本") == 0x65E5 * 31 + 0x672C == 835047
    # U+1F600 is outside the BMP: UTF-16 surrogate pair D83D DE00, hashed as two units
    assert java_string_hash("😀") == 0xD83D * 31 + 0xDE00 == 1772899
    assert java_string_hash("😀") == java_hash_by_hand([0xD83D, 0xDE00])
    # not the code point itself
    assert java_string_hash("😀") != 0x1F600
    assert java_string_hash("a😀b") == java_hash_by_hand([97, 0xD83D, 0xDE00, 98])


def test_java_hash_known_collision():
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("AaAa") == java_string_hash("BBBB") == java_string_hash("AaBB")


def test_index_key_hash():
    assert index_key_hash("polygenelubricants") == 0          # Integer.MIN_VALUE -> 0
    assert index_key_hash("TopicTest#UNIQ") == 1656663421     # abs() of a negative hash
    assert index_key_hash("hello") == 99162322
    assert index_key_hash("") == 0


def test_tags_code():
    assert tags_code(None) == 0
    assert tags_code("") == 0
    assert tags_code("TagA") == java_string_hash("TagA") == 2598919
    assert tags_code("TopicTest#UNIQ") == -1656663421  # negative codes are kept as they are


# --- IndexFile ----------------------------------------------------------------------

SLOTS = 10
ITEMS = 20
HEADER = struct.Struct(">qqqqii")   # begin ts, end ts, begin phy, end phy, hashSlotCount, indexCount
ITEM = struct.Struct(">iqii")       # keyHash, phyOffset, timeDiff (s), prevIndex
T0 = 1_700_000_000_000


def slot_pos(key_hash: int) -> int:
    return 40 + (key_hash % SLOTS) * 4


def item_pos(n: int) -> int:
    return 40 + SLOTS * 4 + n * 20


def read_slot(raw: bytes, key_hash: int) -> int:
    return struct.unpack_from(">i", raw, slot_pos(key_hash))[0]


def read_item(raw: bytes, n: int) -> tuple[int, int, int, int]:
    return ITEM.unpack_from(raw, item_pos(n))


def _create(tmp_path) -> IndexFile:
    return IndexFile.create(tmp_path / "20240101000000000", hash_slot_count=SLOTS, index_count_max=ITEMS,
                            end_phy_offset=0, end_timestamp_ms=0)


def test_index_file_size_and_empty_header(tmp_path):
    index = _create(tmp_path)
    index.flush()
    raw = index.path.read_bytes()
    assert len(raw) == 40 + SLOTS * 4 + ITEMS * 20 == 480
    assert raw[:40] == HEADER.pack(0, 0, 0, 0, 0, 1)  # indexCount starts at 1
    assert raw[40:] == bytes(440)
    index.close()


def test_index_file_two_keys_raw_layout(tmp_path):
    k1, k2 = "TopicTest#k1", "TopicTest#k2"
    h1, h2 = java_hash_by_hand([ord(c) for c in k1]), java_hash_by_hand([ord(c) for c in k2])
    assert (h1, h2) == (2746024, 2746025) and h1 % SLOTS != h2 % SLOTS
    index = _create(tmp_path)
    assert index.put_key(k1, 1000, T0)
    assert index.put_key(k2, 2000, T0 + 5_500)
    index.flush()
    raw = index.path.read_bytes()

    # header: begin ts = first store ts, end ts = last; begin/end phy; 2 slots used; indexCount 3
    assert raw[:40] == HEADER.pack(T0, T0 + 5_500, 1000, 2000, 2, 3)
    assert raw[32:40] == bytes.fromhex("00000002" "00000003")
    # slots hold item numbers
    assert read_slot(raw, h1) == 1
    assert read_slot(raw, h2) == 2
    used_slots = {slot_pos(h1), slot_pos(h2)}
    for pos in range(40, 80, 4):
        if pos not in used_slots:
            assert raw[pos:pos + 4] == bytes(4)
    # item 0 is never used
    assert raw[item_pos(0):item_pos(1)] == bytes(20)
    # item 1: timeDiff 0 (the header had no begin timestamp yet), no previous item
    assert raw[item_pos(1):item_pos(2)] == (struct.pack(">i", h1) + struct.pack(">q", 1000)
                                             + struct.pack(">i", 0) + struct.pack(">i", 0))
    # item 2: timeDiff in whole seconds since begin ts (5.5 s -> 5)
    assert read_item(raw, 2) == (h2, 2000, 5, 0)
    assert raw[item_pos(3):] == bytes(20 * (ITEMS - 3))

    assert index.select(k1, count_max=64, begin_ms=0, end_ms=2 ** 62) == [1000]
    assert index.select(k2, count_max=64, begin_ms=0, end_ms=2 ** 62) == [2000]
    assert index.select("TopicTest#k3", count_max=64, begin_ms=0, end_ms=2 ** 62) == []
    index.close()

    # reopen: the header is read back
    again = IndexFile(index.path, hash_slot_count=SLOTS, index_count_max=ITEMS, writable=False)
    assert (again.begin_timestamp_ms, again.end_timestamp_ms, again.begin_phy_offset, again.end_phy_offset,
            again.hash_slot_used, again.index_count) == (T0, T0 + 5_500, 1000, 2000, 2, 3)
    assert again.select(k2, count_max=64, begin_ms=0, end_ms=2 ** 62) == [2000]
    again.close()


def test_index_file_bucket_chain_via_prev_index(tmp_path):
    # different hashes, same slot (4): 2746024 % 10 == 1829193424 % 10
    k1, k2 = "TopicTest#k1", "TopicTest#order-1"
    h1, h2 = index_key_hash(k1), index_key_hash(k2)
    assert h1 != h2 and h1 % SLOTS == h2 % SLOTS == 4
    assert java_string_hash(k2) == -1829193424 and h2 == 1829193424
    index = _create(tmp_path)
    index.put_key(k1, 100, T0)
    index.put_key(k2, 200, T0 + 1_000)
    index.put_key(k1, 300, T0 + 2_000)
    index.flush()
    raw = index.path.read_bytes()
    assert raw[:40] == HEADER.pack(T0, T0 + 2_000, 100, 300, 1, 4)  # one slot used, 3 items
    assert read_slot(raw, h1) == 3
    assert read_item(raw, 1) == (h1, 100, 0, 0)
    assert read_item(raw, 2) == (h2, 200, 1, 1)  # prev -> item 1
    assert read_item(raw, 3) == (h1, 300, 2, 2)  # prev -> item 2
    # newest first; the other hash in the same bucket is filtered out
    assert index.select(k1, count_max=64, begin_ms=0, end_ms=2 ** 62) == [300, 100]
    assert index.select(k2, count_max=64, begin_ms=0, end_ms=2 ** 62) == [200]
    assert index.select(k1, count_max=1, begin_ms=0, end_ms=2 ** 62) == [300]
    # time window: item 1 is at T0, item 3 at T0 + 2 s
    assert index.select(k1, count_max=64, begin_ms=T0 + 1_000, end_ms=2 ** 62) == [300]
    assert index.select(k1, count_max=64, begin_ms=0, end_ms=T0 + 500) == [100]
    index.close()


def test_index_file_same_hash_collision_not_filtered(tmp_path):
    """Equal hashes ("Aa"/"BB") cannot be told apart: the caller must check the record."""
    index = _create(tmp_path)
    index.put_key("Aa", 10, T0)
    index.put_key("BB", 20, T0)
    raw = index.path.read_bytes()
    assert read_slot(raw, 2112) == 2
    assert read_item(raw, 2) == (2112, 20, 0, 1)
    assert index.select("Aa", count_max=64, begin_ms=0, end_ms=2 ** 62) == [20, 10]
    assert index.select("BB", count_max=64, begin_ms=0, end_ms=2 ** 62) == [20, 10]
    index.close()


def test_index_key_hash_min_value_goes_to_slot_zero(tmp_path):
    index = _create(tmp_path)
    index.put_key("polygenelubricants", 77, T0)
    raw = index.path.read_bytes()
    assert read_slot(raw, 0) == 1
    assert raw[40:44] == struct.pack(">i", 1)
    assert read_item(raw, 1) == (0, 77, 0, 0)
    index.close()


def test_index_file_seeded_from_previous_file_and_full(tmp_path):
    index = IndexFile.create(tmp_path / "20240101000000001", hash_slot_count=SLOTS, index_count_max=3,
                             end_phy_offset=50, end_timestamp_ms=T0)
    raw = index.path.read_bytes()
    assert raw[:40] == HEADER.pack(T0, T0, 50, 50, 0, 1)  # seeded from the previous file's end
    assert index.put_key("a", 60, T0 + 3_000)
    assert index.put_key("b", 70, T0 + 4_000)
    raw = index.path.read_bytes()
    # As in RocketMQ's IndexFile#putKey: the first item's timeDiff is computed against the
    # seeded begin timestamp (3 s), and only then is beginTimestamp reset to this item's time.
    assert raw[:40] == HEADER.pack(T0 + 3_000, T0 + 4_000, 60, 70, 2, 3)
    assert read_item(raw, 1) == (97, 60, 3, 0)
    assert read_item(raw, 2) == (98, 70, 1, 0)
    assert index.is_full
    assert not index.put_key("c", 80, T0 + 5_000)
    assert index.path.read_bytes() == raw
    index.close()


def _hand_write_half_added_item(path, key_hash: int, phy: int, item: int) -> int:
    """A kill after item + slot were written, before the header: returns the old slot value."""
    with open(path, "r+b") as f:
        raw = f.read()
        old_slot = read_slot(raw, key_hash)
        f.seek(item_pos(item))
        f.write(ITEM.pack(key_hash, phy, 9, old_slot))
        f.seek(slot_pos(key_hash))
        f.write(struct.pack(">i", item))
    return old_slot


def test_repair_after_kill_relinks_slot_to_previous_item(tmp_path):
    k1, k2 = "TopicTest#k1", "TopicTest#k2"
    h1 = index_key_hash(k1)
    index = _create(tmp_path)
    index.put_key(k1, 1000, T0)
    index.put_key(k2, 2000, T0 + 1_000)
    index.flush()
    path = index.path
    index.close()
    header_before = path.read_bytes()[:40]
    assert struct.unpack_from(">i", header_before, 36)[0] == 3

    old = _hand_write_half_added_item(path, h1, 3000, 3)  # item number == indexCount
    assert old == 1
    raw = path.read_bytes()
    assert read_slot(raw, h1) == 3 and read_item(raw, 3) == (h1, 3000, 9, 1)
    assert raw[:40] == header_before

    reopened = IndexFile(path, hash_slot_count=SLOTS, index_count_max=ITEMS, writable=True)
    assert reopened.index_count == 3
    reopened.repair_after_kill()
    reopened.flush()
    raw = path.read_bytes()
    assert read_slot(raw, h1) == 1                 # back to the previous item
    assert raw[item_pos(3):item_pos(4)] == bytes(20)  # the half-added item is cleared
    assert raw[:40] == header_before
    assert reopened.select(k1, count_max=64, begin_ms=0, end_ms=2 ** 62) == [1000]
    # the next put reuses item 3 and chains to item 1
    reopened.put_key(k1, 3000, T0 + 2_000)
    raw = path.read_bytes()
    assert read_slot(raw, h1) == 3 and read_item(raw, 3) == (h1, 3000, 2, 1)
    assert reopened.select(k1, count_max=64, begin_ms=0, end_ms=2 ** 62) == [3000, 1000]
    reopened.close()


def test_repair_after_kill_empty_slot_and_item_only(tmp_path):
    index = _create(tmp_path)
    index.put_key("TopicTest#k1", 1000, T0)
    path = index.path
    index.close()
    # half-added item into an empty bucket (slot 6)
    h3 = index_key_hash("TopicTest#k3")
    assert h3 % SLOTS == 6
    assert _hand_write_half_added_item(path, h3, 5000, 2) == 0
    reopened = IndexFile(path, hash_slot_count=SLOTS, index_count_max=ITEMS, writable=True)
    reopened.repair_after_kill()
    raw = path.read_bytes()
    assert read_slot(raw, h3) == 0
    assert raw[item_pos(2):item_pos(3)] == bytes(20)
    reopened.close()

    # a kill after the item but before the slot: only the item is cleared
    with open(path, "r+b") as f:
        f.seek(item_pos(2))
        f.write(ITEM.pack(index_key_hash("TopicTest#k1"), 6000, 1, 1))
    reopened = IndexFile(path, hash_slot_count=SLOTS, index_count_max=ITEMS, writable=True)
    reopened.repair_after_kill()
    raw = path.read_bytes()
    assert read_slot(raw, index_key_hash("TopicTest#k1")) == 1
    assert raw[item_pos(2):item_pos(3)] == bytes(20)
    assert read_item(raw, 1) == (index_key_hash("TopicTest#k1"), 1000, 0, 0)
    reopened.close()


# --- offsetMsgId ----------------------------------------------------------------------

def test_encode_msg_id_golden():
    host = HostAddress.parse("127.0.0.1", 10911)
    by_hand = (bytes([127, 0, 0, 1])          # store ip, 4 bytes
               + struct.pack(">i", 10911)     # port int32 = 0x00002A9F
               + struct.pack(">q", 1000))     # commit log offset int64 = 0x3E8
    assert by_hand.hex().upper() == "7F00000100002A9F00000000000003E8"
    assert encode_msg_id(host, 1000) == "7F00000100002A9F00000000000003E8"
    assert encode_msg_id(HostAddress.parse("10.0.0.1", 51234), 2 ** 40 + 5) == \
        "0A0000010000C8220000010000000005"


def test_decode_msg_id_round_trip():
    host = HostAddress.parse("127.0.0.1", 10911)
    assert decode_msg_id("7F00000100002A9F00000000000003E8") == (host, 1000)
    assert decode_msg_id("7f00000100002a9f00000000000003e8") == (host, 1000)  # lower case too
    for offset in (0, 1, 65536, 2 ** 40 + 5, 2 ** 63 - 1):
        assert decode_msg_id(encode_msg_id(host, offset)) == (host, offset)


@pytest.mark.parametrize("bad", [
    "",
    "7F00000100002A9F00000000000003E",     # 31 characters
    "7F00000100002A9F00000000000003E800",  # 34 characters
    "ZZ00000100002A9F00000000000003E8",    # not hex
    "7F000001-0002A9F00000000000003E8",    # not hex
    "é" * 32,                              # not ASCII
])
def test_decode_msg_id_malformed_raises_value_error(bad):
    with pytest.raises(ValueError):
        decode_msg_id(bad)


def test_decode_msg_id_with_whitespace_raises_value_error():
    """32 characters, but bytes.fromhex skips the spaces and yields only 15 bytes.

    decode_msg_id promises ValueError for a malformed id (callers in
    engine/actors catch ValueError to answer INVALID_MSG_ID).
    """
    bad = "7F 000001 00002A9F00000000000003"
    assert len(bad) == 32
    with pytest.raises(ValueError):
        decode_msg_id(bad)


# --- file names ------------------------------------------------------------------------

def test_file_names():
    assert offset_to_file_name(0) == "00000000000000000000"
    assert offset_to_file_name(1073741824) == "00000000001073741824"
    assert offset_to_file_name(6_000_000) == "00000000000006000000"
    assert offset_to_file_name(2 ** 63 - 1) == "09223372036854775807"
    assert file_name_to_offset("00000000001073741824") == 1073741824
    assert file_name_to_offset("0000000000107374182") is None       # 19 digits
    assert file_name_to_offset("00000000001073741824.tmp") is None
    assert file_name_to_offset("0000000000107374182x") is None


def test_a_reader_follows_the_builder_across_new_and_deleted_files(tmp_path):
    """A read-only IndexService (the front's) sees items as the builder adds them, finds the next
    file when one fills, and a file retention deleted after it listed it is skipped, not fatal."""
    builder = IndexService(tmp_path, hash_slot_count=SLOTS, index_count_max=5, writable=True)
    reader = IndexService(tmp_path, hash_slot_count=SLOTS, index_count_max=5, writable=False)
    reader.follow_writer()
    assert reader.query("T", "k0", count_max=4, begin_ms=0, end_ms=2**62) == []
    for n in range(12):  # 4 items a file (item 0 is never used): three files
        builder.build("T", [f"k{n}"], 100 + n, T0 + n)
        reader.follow_writer()
        assert reader.query("T", f"k{n}", count_max=4, begin_ms=0, end_ms=2**62) == [100 + n]
    assert builder.file_count == 3 and reader.file_count == 3
    assert reader.query("T", "k0", count_max=4, begin_ms=0, end_ms=2**62) == [100]
    for index in reader.mapped.values():  # as after LRU evictions: the old files known by name only
        index.close()
    reader.mapped.clear()
    assert builder.delete_before(108) == 2
    assert reader.query("T", "k1", count_max=4, begin_ms=0, end_ms=2**62) == []
    assert reader.file_count == 1 and reader.query("T", "k11", count_max=4, begin_ms=0, end_ms=2**62) == [111]
    builder.close()
    reader.close()


def test_records_stamped_an_hour_before_the_newest_file_s_name_go_to_a_file_named_after_it(tmp_path):
    """A wall clock set back on the engine that stamped them: the next file is named just after the
    newest (files are ordered by name), found at once, not a millisecond at a time."""
    builder = IndexService(tmp_path, hash_slot_count=SLOTS, index_count_max=3, writable=True)
    hour_ahead = T0 + 3_600_000
    for n in range(2):  # 2 items a file: the second fills the first file
        builder.build("T", [f"k{n}"], 100 + n, hour_ahead + n)
    builder.build("T", ["late"], 102, T0)  # a new file, for a record stamped an hour before the last
    assert builder.file_count == 2 and builder.names == sorted(builder.names)
    assert index_file_ms(builder.names[1]) == index_file_ms(builder.names[0]) + 1
    assert builder.query("T", "late", count_max=4, begin_ms=0, end_ms=2**62) == [102]
    builder.close()
