"""The compiled codec (engine._codec) against its Python reference (engine.codec_py).

Every function must give the same answer byte for byte: the same encoded bytes,
the same dispatch tuples, the same reply map (key order included) or None,
on well-formed segments and on damaged ones (truncated, cut by ``limit``,
a byte flipped at every position of a record).
"""

from __future__ import annotations

import mmap
import random
import struct

import msgspec
import pytest
from msgspec.structs import astuple

from engine import codec_py as py
from engine.ipc.messages import DispatchEntry
from engine.ipc.protocol import MessageView
from engine.layout import CQ_UNIT, HostAddress, decode_record, encode_blank, java_string_hash
from rmqpy.message import Message

try:
    from engine import _codec as c
except ImportError:  # no C compiler when the package was installed
    c = None

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(c is None, reason="engine._codec is not built (pip install -e . compiles it; "
                                         "a machine without a C compiler falls back to engine.codec_py)"),
]

STORE_HOST = HostAddress.parse("127.0.0.1", 10911)
BORN_HOST = HostAddress.parse("10.0.0.1", 51234)
STORE_HOST_V6 = HostAddress.parse("2001:db8::7", 10911)
BASE = 3 * 1024 * 1024 * 1024  # the commit log offset of the segment's first byte
T0 = 1_700_000_000_000
CHARS = "abcXYZ019_-. é߀ÿĀ中文字😀🚀"


# --- random records ----------------------------------------------------------------------

def rand_text(rng: random.Random, low: int, high: int, chars: str = CHARS) -> str:
    return "".join(rng.choice(chars) for _ in range(rng.randint(low, high)))


def rand_topic(rng: random.Random, *, utf8_only: bool = False) -> bytes:
    roll = rng.random()
    if roll < 0.15:
        return ("Topic-" + "x" * rng.randint(122, 300)).encode()          # > 127 bytes: MAGIC_V2
    if roll < 0.2 and not utf8_only:
        return b"bad\xff\xfetopic"                                          # not UTF-8: damage
    return rand_text(rng, 1, 12, "abcXYZ_-%é中😀").encode()


def rand_properties(rng: random.Random) -> bytes:
    """An encoded properties block with every shape decode_properties has to handle."""
    parts = []
    names: list[bytes] = []
    for _ in range(rng.randint(0, 7)):
        roll = rng.random()
        if roll < 0.15:
            name, value = b"TAGS", rng.choice([rand_text(rng, 1, 6).encode(), b"TagA", b"\xe2\x82x",
                                                 b"\x80", b"a\xc0b", b"  "])
        elif roll < 0.3:
            keys = [rand_text(rng, 0, 5, "ab1é😀") for _ in range(rng.randint(1, 4))]
            name, value = b"KEYS", " ".join(keys).encode() or b" "
        elif roll < 0.4:
            name, value = b"UNIQ_KEY", rng.randbytes(16).hex().upper().encode()
        elif roll < 0.5 and names:
            name, value = rng.choice(names), rand_text(rng, 1, 4).encode()   # a duplicate name
        elif roll < 0.55:
            parts.append(rand_text(rng, 1, 5).encode() + b"\x01\x02")          # empty value
            continue
        elif roll < 0.6:
            parts.append(rand_text(rng, 1, 5).encode() + b"\x02")              # no \x01
            continue
        elif roll < 0.65:
            parts.append(b"\x01" + rand_text(rng, 1, 5).encode() + b"\x02")    # empty name
            continue
        elif roll < 0.7:
            parts.append(bytes(rng.choice(b"\x01\x02 \xe2\x82\xac\xf0\x9f\x98\xffab")
                               for _ in range(rng.randint(1, 12))))            # garbage
            continue
        elif roll < 0.75:
            name, value = rng.choice([b"\xff", b"\xfe", b"\xe2\x82"]), b"v\x01w"  # names that decode alike
        elif roll < 0.78:
            name, value = b"__CRC32#", b"0123456789"                             # a fake CRC property
        else:
            name, value = rand_text(rng, 1, 8).encode(), rand_text(rng, 1, 12).encode()
        names.append(name)
        parts.append(name + b"\x01" + value + b"\x02")
    block = b"".join(parts)
    if block and rng.random() < 0.2:
        block = block[:-1]                                                      # no final \x02
    return block


def rand_body(rng: random.Random) -> bytes:
    return rng.randbytes(rng.choice([0, 1, 1, 17, rng.randint(1, 300), 4096]))


def rand_host(rng: random.Random) -> HostAddress:
    """An IPv4 host, or one time in four an IPv6 one (16 bytes of address: SYSFLAG 0x10 / 0x20)."""
    return HostAddress(rng.randbytes(16 if rng.random() < 0.25 else 4),
                       rng.choice([0, 10911, 65535, rng.randint(-2 ** 31, 2 ** 31 - 1)]))


def rand_items(rng: random.Random, count: int) -> list[tuple]:
    """Items of 4 fields, or of 6 with a SYSFLAG and a prepared transaction offset (a commit's)."""
    items = []
    for _ in range(count):
        item: tuple = (rand_body(rng), rand_properties(rng), rng.randint(-2 ** 31, 2 ** 31 - 1),
                       rng.choice([T0 + rng.randint(0, 10 ** 6), rng.randint(-2 ** 63, 2 ** 63 - 1)]))
        if rng.random() < 0.2:
            item += (rng.choice([0x8, rng.randint(-2 ** 31, 2 ** 31 - 1)]), rng.randint(-2 ** 63, 2 ** 63 - 1))
        items.append(item)
    return items


def encode_both(buf_py, buf_c, pos: int, base: int, topic: bytes, queue_id: int, first: int, store_ms: int,
                store_host: HostAddress, born_host: HostAddress, with_crc: bool, items: list[tuple]):
    """Encode the same batch with both codecs; they must agree on the bytes and the answer."""
    args = (pos, base, topic, queue_id, first, store_ms, store_host, born_host, with_crc, items)
    expected = py.encode_records(buf_py, *args)
    got = c.encode_records(buf_c, *args)
    assert got == expected
    assert bytes(buf_c) == bytes(buf_py)
    return expected


def build_segment(rng: random.Random, size: int, *, batches: int, with_crc: bool | None = None,
                  fill: float = 0.8, utf8_only: bool = False) -> tuple[bytearray, list[int]]:
    """A segment of random batches (both codecs must write it identically); the record positions."""
    seg_py, seg_c = bytearray(size), bytearray(size)
    pos, starts = 0, []
    for _ in range(batches):
        items = rand_items(rng, rng.randint(1, 4))
        topic = rand_topic(rng, utf8_only=utf8_only)
        crc = rng.random() < 0.6 if with_crc is None else with_crc
        try:
            offsets, end = encode_both(seg_py, seg_c, pos, BASE, topic, rng.randint(0, 7), rng.randint(0, 10 ** 6),
                                       T0, rng.choice([STORE_HOST, STORE_HOST_V6]), rand_host(rng), crc, items)
        except ValueError:
            break                                                  # the segment is full
        starts += [o - BASE for o in offsets]
        pos = end
        if pos > fill * size:
            break
    return seg_py, starts


# --- comparisons -------------------------------------------------------------------------

def ordered(view: dict | None):
    """A reply map with its key order (and its properties' order) made part of equality."""
    if view is None:
        return None
    return [(k, list(v.items()) if isinstance(v, dict) else (type(v), v)) for k, v in view.items()]


def unpacked(impl, blob: bytes) -> list:
    """Packed dispatch entries back as the tuples scan_dispatch gives."""
    entries, pos = [], 0
    while pos < len(blob):
        entry, pos = impl.unpack_entry(blob, pos)
        entries.append(entry)
    return entries


def same_scan(buf, pos: int, limit: int, base: int = BASE, max_records: int = 1 << 30, owners: int = 3,
              index_uniq: bool = True):
    expected = py.scan_dispatch(buf, pos, limit, base, max_records, owners, index_uniq)
    got = c.scan_dispatch(buf, pos, limit, base, max_records, owners, index_uniq)
    assert got == expected, (pos, limit, max_records, owners)
    for scan in (c, py):  # packed by either, unpacked by either: the same entries
        per_owner, for_index, *rest = scan.scan_dispatch(buf, pos, limit, base, max_records, owners, index_uniq, True)
        assert rest == list(got[2:])
        for impl in (c, py):
            assert [unpacked(impl, blob) for blob in per_owner] == got[0], (scan.__name__, impl.__name__)
            assert unpacked(impl, for_index) == got[1], (scan.__name__, impl.__name__)
    return got


def same_views(buf, pos: int, limit: int, base: int = BASE) -> list:
    views = []
    for check_crc in (False, True):
        for require in (False, True):
            expected = py.read_view(buf, pos, limit, base, check_crc, require)
            got = c.read_view(buf, pos, limit, base, check_crc, require)
            assert ordered(got) == ordered(expected), (pos, limit, check_crc, require)
            views.append(got)
    return views


# --- java_hash and owner_index ------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "", "a", "TagA", "hello", "polygenelubricants", "Aa", "BB",          # ASCII, overflow, collision
    "é", "Grüße ÿ", "\x00\x7f\x80\xff",                                   # Latin-1
    "中文", "€Ā\uffff", "\ud7ff\ue000",                                   # BMP
    "😀", "a😀b", "🚀" * 50, "\U0010ffff\U00010000", "ß中😀",             # non-BMP: surrogate pairs
])
def test_java_hash_matches_reference(text):
    assert c.java_hash(text) == java_string_hash(text) == py.java_hash(text)


def test_java_hash_random_strings():
    rng = random.Random(1)
    for _ in range(500):
        text = "".join(chr(rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0xFF), rng.randint(0x100, 0xD7FF),
                                       rng.randint(0xE000, 0xFFFF), rng.randint(0x10000, 0x10FFFF)]))
                       for _ in range(rng.randint(0, 40)))
        assert c.java_hash(text) == java_string_hash(text)


def test_java_hash_lone_surrogate_fails_as_the_reference_does():
    for text in ("a\ud800", "\udfff😀"):
        with pytest.raises(UnicodeEncodeError):
            java_string_hash(text)
        with pytest.raises(UnicodeEncodeError):
            c.java_hash(text)
    with pytest.raises(TypeError):
        c.java_hash(b"bytes")


def test_owner_index_matches_reference():
    rng = random.Random(2)
    cases = [("TopicTest", 3, 4), ("中文😀", 0, 1), ("t", -7, 3), ("t", 2 ** 80, 5), ("t", True, 3),
             ("t", 1, -3), ("", 0, 2), ("x" * 300, 2 ** 31 - 1, 2 ** 70)]
    cases += [(rand_text(rng, 0, 20), rng.randint(-2 ** 40, 2 ** 40), rng.randint(1, 64)) for _ in range(300)]
    for topic, queue_id, owners in cases:
        assert c.owner_index(topic, queue_id, owners) == py.owner_index(topic, queue_id, owners), (topic, queue_id)
    with pytest.raises(ZeroDivisionError):
        c.owner_index("t", 1, 0)


# --- encode_records ---------------------------------------------------------------------

def test_encode_records_random_batches_byte_identical():
    rng = random.Random(3)
    for _ in range(40):
        size = 64 * 1024
        buf_py, buf_c = bytearray(size), bytearray(size)
        pos = rng.randint(0, 1000)
        items = rand_items(rng, rng.randint(0, 12))
        encode_both(buf_py, buf_c, pos, rng.choice([0, BASE, 2 ** 62]), rand_topic(rng), rng.randint(-5, 2 ** 31 - 1),
                    rng.randint(0, 2 ** 40), rng.randint(-2 ** 63, 2 ** 63 - 1), rand_host(rng), rand_host(rng),
                    rng.random() < 0.5, items)


@pytest.mark.parametrize("with_crc", [False, True])
@pytest.mark.parametrize("topic_len", [1, 127, 128, 300])
def test_encode_records_topic_widths(with_crc, topic_len):
    items = [(b"x" * 256, b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02", 0, T0), (b"", b"", 1, T0), (b"y", b"a\x01b\x02", 2, T0)]
    buf_py, buf_c = bytearray(4096), bytearray(4096)
    offsets, end = encode_both(buf_py, buf_c, 8, BASE, b"T" * topic_len, 1, 0, T0, STORE_HOST, BORN_HOST,
                               with_crc, items)
    assert offsets[0] == BASE + 8 and len(offsets) == 3
    assert struct.unpack_from(">I", buf_c, 12)[0] == (0xDAA320AB if topic_len > 127 else 0xDAA320A7)
    assert c.scan_dispatch(buf_c, 8, end, BASE, 10, 2)[2:] == (3, end, py.SCAN_MORE)


def test_encode_records_bodies_from_views_and_mmap():
    body = memoryview(b"0123456789" * 100)[5:805]
    items = [(body, b"KEYS\x01a b\x02", 7, T0), (memoryview(b"z"), b"", 0, T0)]
    with mmap.mmap(-1, 8192) as mm_py, mmap.mmap(-1, 8192) as mm_c:
        encode_both(mm_py, mm_c, 100, 0, b"TopicM", 0, 5, T0, STORE_HOST, BORN_HOST, True, items)
        assert same_scan(mm_c, 100, 8192, base=0)[2] == 2
        same_views(mm_c, 100, 8192, base=0)


def test_encode_records_pads_a_short_ip_as_struct_does():
    host = HostAddress(b"\x01\x02", 80)
    encode_both(bytearray(512), bytearray(512), 0, 0, b"T", 0, 0, T0, host, host, False, [(b"b", b"", 0, T0)])


def test_encode_records_overflow_raises_and_writes_nothing():
    items = [(b"x" * 256, b"TAGS\x01TagA\x02", 0, T0)] * 3
    need = py.encode_records(bytearray(4096), 0, 0, b"TopicO", 0, 0, T0, STORE_HOST, BORN_HOST, True, items)[1]
    for size, pos in ((need - 1, 0), (need + 9, 10), (0, 0)):
        for codec in (py, c):
            buf = bytearray(size)
            with pytest.raises(ValueError):
                codec.encode_records(buf, pos, 0, b"TopicO", 0, 0, T0, STORE_HOST, BORN_HOST, True, items)
            assert buf == bytearray(size)
    for codec in (py, c):
        with pytest.raises(ValueError):
            codec.encode_records(bytearray(4096), -1, 0, b"TopicO", 0, 0, T0, STORE_HOST, BORN_HOST, True, items)
        assert codec.encode_records(bytearray(8), 8, 100, b"T", 0, 0, T0, STORE_HOST, BORN_HOST, True, []) == ([], 8)


def test_encode_records_bad_arguments():
    buf = bytearray(4096)
    with pytest.raises(TypeError):
        c.encode_records(b"read-only", 0, 0, b"T", 0, 0, T0, STORE_HOST, BORN_HOST, True, [])
    with pytest.raises(ValueError):
        c.encode_records(buf, 0, 0, b"T", 2 ** 31, 0, T0, STORE_HOST, BORN_HOST, True, [(b"b", b"", 0, T0)])
    with pytest.raises(ValueError):
        c.encode_records(buf, 0, 0, b"T", 0, 0, T0, STORE_HOST, BORN_HOST, True, [(b"b", b"", 0)])
    with pytest.raises(TypeError):
        c.encode_records(buf, 0, 0, b"T", 0, 0, T0, STORE_HOST, BORN_HOST, True, [("str body", b"", 0, T0)])
    with pytest.raises(ValueError):
        c.encode_records(buf, 0, 0, b"T", 0, 0, T0, STORE_HOST, BORN_HOST, True, [(b"", b"p" * 65520, 0, T0)])
    with pytest.raises(TypeError):
        c.encode_records(buf, 0, 0, b"T", 0, 0, T0, STORE_HOST, BORN_HOST, True)
    assert buf == bytearray(4096)


# --- scan_dispatch and read_view on whole segments -----------------------------------------

def test_random_segments_scan_and_views_agree():
    rng = random.Random(4)
    for _ in range(12):
        seg, starts = build_segment(rng, 64 * 1024, batches=12)
        end = starts[-1] + struct.unpack_from(">i", seg, starts[-1])[0] if starts else 0
        for owners in (1, 2, 3, 4):
            same_scan(seg, 0, len(seg), owners=owners)
        same_scan(seg, 0, end)
        for start in starts:
            same_scan(seg, start, len(seg))
            same_views(seg, start, len(seg))
            same_views(seg, start, end)


def test_without_the_uniq_key_index_only_user_keys_reach_the_index():
    rng = random.Random(44)
    seg, starts = build_segment(rng, 64 * 1024, batches=12)
    with_uniq = same_scan(seg, 0, len(seg))
    expected = same_scan(seg, 0, len(seg), index_uniq=False)
    assert expected[0] == with_uniq[0]  # the owners' entries do not change
    uniq = {decode_record(seg, start, limit=len(seg), base_offset=BASE, check_crc=False).uniq_key for start in starts}
    assert uniq - {None} and not uniq & {key for entry in expected[1] for key in entry[7]}


def test_segment_with_blank_marker():
    rng = random.Random(5)
    seg, starts = build_segment(rng, 32 * 1024, batches=6, with_crc=True, utf8_only=True)
    end = starts[-1] + struct.unpack_from(">i", seg, starts[-1])[0]
    encode_blank(seg, end, len(seg) - end)
    assert same_scan(seg, 0, len(seg))[2:] == (len(starts), end, py.SCAN_BLANK)
    assert same_scan(seg, 0, len(seg), max_records=len(starts))[2:] == (len(starts), end, py.SCAN_MORE)
    same_views(seg, end, len(seg))
    for limit in (end, end + 7, end + 8, len(seg) - 1):
        same_scan(seg, 0, limit)
    struct.pack_into(">i", seg, end, len(seg) - end - 1)                 # a blank with the wrong size
    same_scan(seg, 0, len(seg))


def test_zero_tail_and_short_blank():
    rng = random.Random(6)
    seg, starts = build_segment(rng, 16 * 1024, batches=4)
    end = starts[-1] + struct.unpack_from(">i", seg, starts[-1])[0]
    same_scan(seg, 0, len(seg))                                          # zeros after the last record
    seg = seg[:end + 5]
    same_scan(seg, 0, len(seg))                                          # fewer than 8 bytes left


def test_limit_in_the_middle_of_records():
    rng = random.Random(7)
    seg, starts = build_segment(rng, 8 * 1024, batches=5, fill=0.5)
    end = starts[-1] + struct.unpack_from(">i", seg, starts[-1])[0]
    for limit in range(end + 2):
        same_scan(seg, 0, limit)
    for start in starts:
        for limit in range(start, min(end, start + 700)):
            same_views(seg, start, limit)


def test_max_records_and_owner_counts():
    rng = random.Random(8)
    seg, starts = build_segment(rng, 64 * 1024, batches=10)
    n = len(starts)
    for max_records in (0, 1, n // 2, n - 1, n, n + 5, -3, 2 ** 70):
        for owners in (1, 2, 3, 4):
            result = same_scan(seg, 0, len(seg), max_records=max_records, owners=owners)
            assert sum(len(entries) for entries in result[0]) == result[2]


def test_wrong_base_offset_is_damage():
    rng = random.Random(9)
    seg, _starts = build_segment(rng, 8 * 1024, batches=2)
    for base in (0, BASE + 1, BASE - 20, 2 ** 63 - 10, 2 ** 64, -2 ** 70):
        assert same_scan(seg, 0, len(seg), base=base)[4] == py.SCAN_DAMAGE
        same_views(seg, 0, len(seg), base=base)


def test_buffer_views_and_bytes():
    rng = random.Random(10)
    seg, starts = build_segment(rng, 8 * 1024, batches=3)
    for buf in (bytes(seg), memoryview(seg), memoryview(bytes(seg))):
        same_scan(buf, 0, len(seg))
        for start in starts:
            same_views(buf, start, len(seg))


# --- damage ----------------------------------------------------------------------------

def flip_everywhere(seg: bytearray, start: int, size: int, masks=(0xFF, 0x01)) -> None:
    """Flip each byte of the record at ``start`` in turn; both codecs must agree every time."""
    for at in range(start, start + size):
        for mask in masks:
            seg[at] ^= mask
            same_scan(seg, 0, len(seg))
            same_views(seg, start, len(seg))
            seg[at] ^= mask


@pytest.mark.parametrize("with_crc", [False, True])
def test_every_flipped_byte(with_crc):
    rng = random.Random(11 + with_crc)
    for _ in range(3):
        seg, starts = build_segment(rng, 48 * 1024, batches=3, with_crc=with_crc, fill=0.3)
        start = starts[len(starts) // 2]
        size = struct.unpack_from(">i", seg, start)[0]
        flip_everywhere(seg, start, min(size, 600))


def test_flipped_bytes_in_a_small_record():
    """A small record with every special property, so every flip lands somewhere that matters."""
    props = b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01ABCDEF\x02a\x01b\x02a\x01c\x02"
    for with_crc in (False, True):
        for topic in (b"Topic", b"V2" * 70):
            seg_py, seg_c = bytearray(1024), bytearray(1024)
            encode_both(seg_py, seg_c, 0, BASE, topic, 1, 2, T0, STORE_HOST, BORN_HOST, with_crc,
                        [(b"hello", props, 0, T0), (b"world", props, 0, T0)])
            size = struct.unpack_from(">i", seg_c, 0)[0]
            flip_everywhere(seg_c, 0, size, masks=(0xFF, 0x01, 0x10, 0x20, 0x80))


def test_record_crc_property_damage_heuristics():
    """A damaged __CRC32# name (two bytes at most), malformed digits, a missing property."""
    seg_py, seg_c = bytearray(1024), bytearray(1024)
    _offsets, end = encode_both(seg_py, seg_c, 0, BASE, b"TopicC", 0, 0, T0, STORE_HOST, BORN_HOST, True,
                               [(b"body", b"KEYS\x01k\x02", 0, T0)])
    tail = end - 20
    variants = []
    for i in range(9):
        for j in range(i, 9):
            for separator in (0x01, 0x03):                           # the \x01 after the name, or not
                damaged = bytearray(seg_c)
                damaged[tail + i] ^= 0x20
                damaged[tail + j] ^= 0x40
                damaged[tail + 8] = separator
                variants.append(damaged)
    for k in range(9, 20):
        damaged = bytearray(seg_c)
        damaged[tail + k] = ord("x")
        variants.append(damaged)
    zeroed = bytearray(seg_c)
    zeroed[tail:end] = bytes(20)
    variants.append(zeroed)
    for buf in variants:
        same_views(buf, 0, len(buf))
        same_scan(buf, 0, len(buf))
    # a record written without the CRC property whose last user property looks like one
    for name in (b"__CRC32#", b"__CRC3X#", b"__CRXX2#", b"XXXX32#_"):
        buf_py, buf_c = bytearray(512), bytearray(512)
        encode_both(buf_py, buf_c, 0, BASE, b"TopicC", 0, 0, T0, STORE_HOST, BORN_HOST, False,
                    [(b"body", name + b"\x010123456789\x02", 0, T0)])
        same_views(buf_c, 0, len(buf_c))


def test_garbage_buffers():
    rng = random.Random(13)
    magic = struct.pack(">I", 0xDAA320A7)
    for _ in range(300):
        buf = bytearray(rng.randbytes(rng.randint(0, 400)))
        if len(buf) >= 8 and rng.random() < 0.7:
            buf[4:8] = magic
            struct.pack_into(">i", buf, 0, rng.randint(80, max(80, len(buf) + 10)))
            if len(buf) >= 36:
                struct.pack_into(">q", buf, 28, BASE)
        same_scan(buf, 0, len(buf))
        same_views(buf, 0, len(buf))


def test_bad_read_arguments():
    buf = bytearray(256)
    for fn in (c.scan_dispatch, c.read_view):
        with pytest.raises(TypeError):
            fn("not a buffer", 0, 10, 0, 1, 1)
        with pytest.raises(ValueError):
            fn(buf, 0, 257, 0, 1, 1)           # limit past the buffer (Python: struct.error)
        with pytest.raises(ValueError):
            fn(buf, -1, 10, 0, 1, 1)
        with pytest.raises(TypeError):
            fn(buf, 0, 10)
    with pytest.raises(ValueError):
        c.scan_dispatch(buf, 0, 10, 0, 1, 0)   # no owner to dispatch to
    assert c.read_view(buf, 300, 256, 0, True, True) is None
    assert c.scan_dispatch(buf, 300, 256, 0, 5, 2) == ([[], []], [], 0, 300, py.SCAN_MORE)


# --- index_put_keys ------------------------------------------------------------------------

def empty_index(slots: int, count_max: int, *, count: int = 1, begin_ts: int = 0) -> bytearray:
    buf = bytearray(40 + slots * 4 + count_max * 20)
    struct.pack_into(">qqqqii", buf, 0, begin_ts, begin_ts, 0, 0, 0, count)
    return buf


@pytest.mark.parametrize("slots,count_max,header_count", [(7, 64, 1), (1, 16, 1), (97, 500, 0), (5, 3, 1)])
def test_index_put_keys_byte_identical_until_full(slots, count_max, header_count):
    rng = random.Random(slots * 1000 + count_max)
    bufs = [empty_index(slots, count_max, count=header_count), empty_index(slots, count_max, count=header_count)]
    offset, ts = 0, T0
    while True:
        prefix = rand_text(rng, 0, 8) + "#"
        keys = [rand_text(rng, 1, 10) for _ in range(rng.randint(0, 4))]
        offset += rng.randint(1, 5000)
        ts += rng.choice([-3000, 0, 999, 1000, 60_000])
        added = [impl.index_put_keys(buf, slots, count_max, prefix, keys, offset, ts)
                 for impl, buf in ((py, bufs[0]), (c, bufs[1]))]
        assert added[0] == added[1]
        assert bufs[0] == bufs[1]
        if added[0] < len(keys):
            break
    assert struct.unpack_from(">i", bufs[1], 36)[0] == count_max  # the count stops at the file's capacity


@pytest.mark.parametrize("slots,count_max", [(7, 64), (1, 16), (97, 500), (5, 3)])
def test_index_put_records_is_index_put_keys_record_by_record(slots, count_max):
    """A batch of records (DispatchEntry, or the catch-up's tuples) put from where the last call
    stopped, into files that fill up, gives the bytes of index_put_keys called record by record."""
    rng = random.Random(slots * 7 + count_max)
    entries: list = []
    offset, ts = 0, T0
    for _ in range(120):
        offset += rng.randint(1, 5000)
        ts += rng.choice([-3000, 0, 999, 1000, 60_000])
        keys = [rand_text(rng, 1, 10) for _ in range(rng.randint(1, 4))]
        fields = (rand_text(rng, 0, 8), 0, 0, offset, 100, 0, ts, keys)
        entries.append(fields if rng.random() < 0.5 else DispatchEntry(*fields))
    min_offset = entries[5].commit_log_offset if isinstance(entries[5], DispatchEntry) else entries[5][3]

    def one_by_one() -> list[bytearray]:  # IndexService.build's way, with a new file whenever one fills
        files = [empty_index(slots, count_max)]
        for item in entries:
            topic, clo, stamp, keys = (item[0], item[3], item[6], item[7]) if isinstance(item, tuple) else (
                item.topic, item.commit_log_offset, item.store_timestamp, item.keys)
            if clo < min_offset:
                continue
            done = 0
            while done < len(keys):
                if struct.unpack_from(">i", files[-1], 36)[0] >= count_max:
                    files.append(empty_index(slots, count_max))
                done += py.index_put_keys(files[-1], slots, count_max, f"{topic}#", keys[done:], clo, stamp)
        return files

    expected = one_by_one()
    packed = b"".join(py.pack_entry(item if isinstance(item, tuple) else astuple(item)) for item in entries)
    for impl in (py, c):
        for batch in (entries, packed):  # the packed form's cursor is a byte position
            files = [empty_index(slots, count_max)]
            entry = key = 0
            while entry < len(batch):
                if struct.unpack_from(">i", files[-1], 36)[0] >= count_max:
                    files.append(empty_index(slots, count_max))
                entry, key = impl.index_put_records(files[-1], slots, count_max, batch, entry, key, min_offset)
            assert files == expected, (impl.__name__, type(batch))
    assert c.index_put_records(files[-1], slots, count_max, entries, len(entries), 0, 0) == (len(entries), 0)


def test_index_put_records_bad_arguments():
    buf = empty_index(3, 4)
    with pytest.raises(TypeError):
        c.index_put_records(buf, 3, 4, [("t", 0, 0, 1, 1, 0, T0)], 0, 0, 0)          # 7 fields
    with pytest.raises(TypeError):
        c.index_put_records(buf, 3, 4, [("t", 0, 0, 1, 1, 0, T0, ("k",))], 0, 0, 0)  # keys not a list
    with pytest.raises(AttributeError):
        c.index_put_records(buf, 3, 4, [object()], 0, 0, 0)  # not a DispatchEntry
    with pytest.raises(TypeError):
        c.index_put_records(buf, 3, 4, 5, 0, 0, 0)
    with pytest.raises(ValueError):
        c.index_put_records(bytearray(10), 3, 4, [], 0, 0, 0)
    assert buf == empty_index(3, 4), "nothing written by a refused call"


def test_index_put_keys_time_diff_clamps_and_collisions_chain():
    bufs = [empty_index(1, 8, begin_ts=T0), empty_index(1, 8, begin_ts=T0)]
    for impl, buf in ((py, bufs[0]), (c, bufs[1])):
        assert impl.index_put_keys(buf, 1, 8, "T#", ["Aa", "BB"], 100, T0 + 5_500) == 2   # same Java hash
        assert impl.index_put_keys(buf, 1, 8, "", ["T#x"], 200, T0 + 10 ** 15) == 1      # diff past int32
        assert impl.index_put_keys(buf, 1, 8, "T#", ["y"], 300, T0 - 10 ** 6) == 1       # before the begin
    assert bufs[0] == bufs[1]


def test_index_put_keys_bad_arguments():
    buf = empty_index(3, 4)
    with pytest.raises(ValueError):
        c.index_put_keys(bytearray(10), 3, 4, "T#", ["k"], 1, T0)      # smaller than the file
    with pytest.raises((TypeError, BufferError)):
        c.index_put_keys(bytes(buf), 3, 4, "T#", ["k"], 1, T0)         # read-only
    with pytest.raises(TypeError):
        c.index_put_keys(buf, 3, 4, "T#", [b"k"], 1, T0)
    with pytest.raises(ValueError):
        c.index_put_keys(buf, 0, 4, "T#", ["k"], 1, T0)


# --- pull_run ------------------------------------------------------------------------------

BLANK_UNIT = CQ_UNIT.pack(0, 0x7FFFFFFF, 0)


def test_msgspec_uses_the_forms_pull_run_writes():
    """pull_run writes msgpack itself: these are the forms it assumes msgspec chooses."""
    enc = msgspec.msgpack.Encoder().encode
    ints = {0: "00", 127: "7f", 128: "cc80", 255: "ccff", 256: "cd0100", 65535: "cdffff", 65536: "ce00010000",
            2 ** 32 - 1: "ceffffffff", 2 ** 32: "cf0000000100000000", 2 ** 63 - 1: "cf7fffffffffffffff",
            -1: "ff", -32: "e0", -33: "d0df", -128: "d080", -129: "d1ff7f", -32768: "d18000",
            -32769: "d2ffff7fff", -2 ** 31: "d280000000", -2 ** 31 - 1: "d3ffffffff7fffffff",
            -2 ** 63: "d38000000000000000"}
    for value, expected in ints.items():
        assert enc(value).hex() == expected, value
    for n, str_head, bin_head in ((0, "a0", "c400"), (31, "bf", "c41f"), (32, "d920", "c420"), (255, "d9ff", "c4ff"),
                                  (256, "da0100", "c50100"), (65535, "daffff", "c5ffff"),
                                  (65536, "db00010000", "c600010000")):
        assert enc("a" * n).hex() == str_head + "61" * n
        assert enc(b"a" * n).hex() == bin_head + "61" * n
    for n, head in ((0, "90"), (15, "9f"), (16, "dc0010"), (65535, "dcffff"), (65536, "dd00010000")):
        assert enc([0] * n).hex().startswith(head)
    for n, head in ((0, "80"), (15, "8f"), (16, "de0010"), (19, "de0013"), (65536, "df00010000")):
        assert enc({str(i): 0 for i in range(n)}).hex().startswith(head)
    assert enc(None).hex() == "c0"
    assert enc({"é": "中😀"}) == b"\x81\xa2" + "é".encode() + b"\xa7" + "中😀".encode()


def clean_properties(rng: random.Random) -> bytes:
    """Properties a plain run takes: UTF-8, no name twice (with TAGS, KEYS, UNIQ_KEY and long values)."""
    props: dict[str, str] = {}
    if rng.random() < 0.7:
        props["TAGS"] = rng.choice(["TagA", rand_text(rng, 1, 40), "t" * rng.choice([31, 32, 255, 256])])
    if rng.random() < 0.7:
        props["KEYS"] = " ".join(rand_text(rng, 0, 6, "ab1é😀") for _ in range(rng.choice([1, 2, 3, 15, 16, 20])))
        props["KEYS"] = props["KEYS"] or " "
    if rng.random() < 0.6:
        props["UNIQ_KEY"] = rng.randbytes(16).hex().upper()
    for _ in range(rng.choice([0, 1, 2, 3, 15, 16, 40])):
        props[rand_text(rng, 1, 8)] = rand_text(rng, 1, rng.choice([5, 40, 300]))
    block = "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode()
    # entries decode_properties skips, which pull_run must skip too
    if rng.random() < 0.2:
        block += rng.choice([b"empty\x01\x02", b"\x01noname\x02", b"nosep\x02", b"\x02\x02", b"v\x01a\x01b\x02"])
    if block and rng.random() < 0.2:
        block = block[:-1]                                                       # no final \x02
    return block


def dirty_properties(rng: random.Random) -> bytes:
    """Properties that stop a run: invalid UTF-8 somewhere, or a kept name twice."""
    roll = rng.random()
    if roll < 0.5:
        block = clean_properties(rng)
        bad = rng.choice([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80"])
        at = rng.randint(0, len(block))
        return block[:at] + bad + block[at:]
    if roll < 0.8:
        name = rng.choice([b"TAGS", b"KEYS", b"UNIQ_KEY", b"__CRC32#", b"user", "é".encode()])
        return name + b"\x01a\x02x\x01y\x02" + name + b"\x01b\x02"
    return rand_properties(rng)                                                  # anything at all


def pull_items(rng: random.Random, count: int, dirty: float) -> list[tuple]:
    return [(rng.randbytes(rng.choice([0, 1, 31, 32, 255, 256, rng.randint(1, 700)])),
             dirty_properties(rng) if rng.random() < dirty else clean_properties(rng),
             rng.choice([0, 1, -1, rng.randint(-2 ** 31, 2 ** 31 - 1)]),
             rng.choice([T0 + rng.randint(0, 10 ** 6), rng.randint(-2 ** 63, 2 ** 63 - 1), 0, -5, 200]))
            for _ in range(count)]


def build_queue(rng: random.Random, size: int, topic: bytes, queue_id: int, first_queue_offset: int, *,
                dirty: float = 0.05, other: float = 0.3, base: int = BASE) -> tuple[bytearray, list[bytes]]:
    """A segment holding the queue's records (batches of them) among other queues'; the queue's units."""
    seg_py, seg_c = bytearray(size), bytearray(size)
    pos, units, queue_offset = 0, [], first_queue_offset
    while True:
        mine = rng.random() >= other
        items = pull_items(rng, rng.randint(1, 5), dirty)
        if mine:
            batch_topic, batch_queue, first = topic, queue_id, queue_offset
        else:                                               # another queue: same topic or same id, or neither
            batch_topic = rng.choice([topic, rand_topic(rng, utf8_only=True)])
            batch_queue = rng.choice([queue_id, queue_id ^ 1])
            first = rng.choice([queue_offset, rng.randint(0, 10 ** 6)])
        try:
            offsets, end = encode_both(seg_py, seg_c, pos, base, batch_topic, batch_queue, first,
                                       rng.choice([T0, -1, 2 ** 40]), rand_host(rng), rand_host(rng),
                                       rng.random() < 0.7, items)
        except ValueError:
            return seg_c, units
        if mine:
            for offset in offsets:
                units.append(CQ_UNIT.pack(offset, struct.unpack_from(">i", seg_c, offset - base)[0],
                                          rng.randint(-2 ** 31, 2 ** 31 - 1)))
            queue_offset += len(offsets)
        pos = end


def same_pull(units, units_pos, unit_count, seg, seg_start, visible_end, log_min, topic, queue_id, queue_offset,
              max_bytes, taken, require):
    args = (units, units_pos, unit_count, seg, seg_start, visible_end, log_min, topic, queue_id, queue_offset,
            max_bytes, taken, require)
    expected = py.pull_run(*args)
    got = c.pull_run(*args)
    assert type(got[0]) is bytes
    assert got == expected, (units_pos, unit_count, seg_start, visible_end, log_min, queue_offset, max_bytes,
                             taken, require)
    # pull_objects: the same run, each message built rather than encoded (here as a dict: what msgspec decodes)
    built = c.pull_objects(dict, False, *args)
    assert built == py.pull_objects(dict, False, *args)
    assert built[1:] == got[1:] and built[0] == (decoded_run(got[0], got[1]) if got[1] else [])
    return got


def decoded_run(maps: bytes, count: int) -> list:
    head = bytes([0x90 | count]) if count < 16 else b"\xdc" + count.to_bytes(2, "big")
    return msgspec.msgpack.decode(head + maps)


def expected_views(units: bytes, count: int, seg, seg_start: int, visible_end: int, require: bool) -> list:
    limit = min(len(seg), visible_end - seg_start)
    return [py.read_view(seg, CQ_UNIT.unpack_from(units, i * CQ_UNIT.size)[0] - seg_start, limit, seg_start, True,
                         require) for i in range(count)]


def test_pull_run_whole_queue_decodes_to_read_views():
    rng = random.Random(20)
    for topic in (b"TopicP", "主题😀".encode(), b"P" * 200):
        seg, units = build_queue(rng, 96 * 1024, topic, 2, 1000, dirty=0.0, other=0.0)
        blob = b"".join(units)
        n = len(units)
        for require in (False, True):
            maps, count, taken = same_pull(blob, 0, n, seg, BASE, BASE + len(seg), 0, topic.decode(), 2, 1000,
                                           1 << 40, 0, require)
            if require:                                     # batches without the record CRC stop it
                continue
            assert count == n and taken == sum(CQ_UNIT.unpack(u)[1] for u in units)
            views = expected_views(blob, n, seg, BASE, BASE + len(seg), False)
            assert [ordered(v) for v in decoded_run(maps, count)] == [ordered(v) for v in views]
            assert maps == b"".join(msgspec.msgpack.encode(v) for v in views)
            array = (bytes([0x90 | count]) if count < 16 else b"\xdc" + count.to_bytes(2, "big")) + maps
            for kind, tuple_keys in ((MessageView, False), (Message, True)):  # the readers' own types, built
                built = c.pull_objects(kind, tuple_keys, blob, 0, n, seg, BASE, BASE + len(seg), 0, topic.decode(),
                                       2, 1000, 1 << 40, 0, False)
                assert built[0] == msgspec.msgpack.Decoder(list[kind]).decode(array)
                assert built[0] == py.pull_objects(kind, tuple_keys, blob, 0, n, seg, BASE, BASE + len(seg), 0,
                                                   topic.decode(), 2, 1000, 1 << 40, 0, False)[0]


def test_pull_run_random_queues_agree():
    rng = random.Random(21)
    for round_ in range(30):
        topic = rng.choice([b"TopicR", rand_text(rng, 1, 10, "abcé中😀").encode(), b"R" * 150])
        queue_id = rng.choice([0, 3, 2 ** 31 - 1])
        first = rng.choice([0, 77, 2 ** 40])
        seg, units = build_queue(rng, 48 * 1024, topic, queue_id, first, dirty=rng.choice([0.0, 0.02, 0.1]))
        seg_start = BASE
        # damage the unit list: blanks, implausible units, other queues' records, wrong sizes
        clean = list(units)
        for _ in range(rng.choice([0, 0, 1, 2])):
            if not units:
                break
            i = rng.randrange(len(units))
            offset, size, code = CQ_UNIT.unpack(clean[i])
            units[i] = rng.choice([
                BLANK_UNIT, CQ_UNIT.pack(offset, 0, code), CQ_UNIT.pack(offset, -size, code),
                CQ_UNIT.pack(-offset, size, code), CQ_UNIT.pack(offset, size + 1, code),
                CQ_UNIT.pack(offset, size - 1, code), CQ_UNIT.pack(offset + 4, size, code),
                CQ_UNIT.pack(offset + 10 ** 9, size, code), CQ_UNIT.pack(2 ** 63 - 1, size, code),
                CQ_UNIT.pack(offset, 2 ** 31 - 2, code),
                clean[rng.randrange(len(units))],                            # another unit's record
            ])
        # damage records: a flipped byte
        for _ in range(rng.choice([0, 0, 0, 1, 2])):
            if units:
                offset, size, _ = CQ_UNIT.unpack(rng.choice(units))
                if 0 <= offset - seg_start < len(seg) and 0 < size < 2 ** 31 - 1:
                    at = offset - seg_start + rng.randrange(min(size, len(seg) - (offset - seg_start)))
                    seg[at] ^= rng.choice([0x01, 0x80, 0xFF])
        prefix = rng.randbytes(rng.choice([0, 20, 7]))                       # units_pos need not be aligned
        blob = prefix + b"".join(units) + rng.randbytes(rng.choice([0, 20, 5]))
        n = len(units)
        sizes = [CQ_UNIT.unpack(u)[1] for u in units]
        ends = sorted(CQ_UNIT.unpack(u)[0] + s for u, s in zip(units, sizes, strict=True))
        for _ in range(20):
            start = rng.randint(0, n) if rng.random() < 0.1 else rng.randint(0, max(n - 1, 0))
            count = min(n - start, rng.choice([n - start, n - start, n - start, rng.randint(0, n - start), 1]))
            args = {"seg": seg, "seg_start": seg_start, "visible_end": seg_start + len(seg), "log_min": 0,
                    "topic": topic.decode(), "queue_id": queue_id, "queue_offset": first + start,
                    "max_bytes": 1 << 40, "taken": 0, "require": False}
            change = rng.choice(["none"] * 8 + ["visible_end", "log_min", "segment", "seg_start", "identity",
                                                "max_bytes", "max_bytes", "require"])
            if change == "visible_end" and ends:
                args["visible_end"] = rng.choice([rng.choice(ends), rng.choice(ends) - 1, seg_start + len(seg) + 100])
            elif change == "log_min" and ends:
                args["log_min"] = rng.choice([seg_start, rng.choice(ends) - 1, -5, seg_start + 1])
            elif change == "segment":                                        # records past the segment
                args["seg"] = seg[:rng.randint(0, len(seg))]
            elif change == "seg_start":                                      # records in another segment
                args["seg_start"] = seg_start + rng.choice([-1, 1, 100, -len(seg)])
            elif change == "identity":
                key, value = rng.choice([("queue_offset", first + start + 1), ("queue_offset", first + start - 1),
                                         ("topic", "Other"), ("topic", topic.decode() + "x"), ("topic", ""),
                                         ("queue_id", queue_id ^ 1)])
                args[key] = value
            elif change == "max_bytes":
                args["max_bytes"] = rng.choice([0, 1, rng.randint(0, 20_000), sum(sizes[start:start + 3])])
                args["taken"] = rng.choice([0, 1, rng.randint(0, 20_000), -5])
            elif change == "require":
                args["require"] = True
            a = args
            maps, got_count, _got_taken = same_pull(blob, len(prefix) + start * 20, count, a["seg"], a["seg_start"],
                                                   a["visible_end"], a["log_min"], a["topic"], a["queue_id"],
                                                   a["queue_offset"], a["max_bytes"], a["taken"], a["require"])
            if got_count:
                views = expected_views(blob[len(prefix) + start * 20:], got_count, a["seg"], a["seg_start"],
                                       a["visible_end"], a["require"])
                assert [ordered(v) for v in decoded_run(maps, got_count)] == [ordered(v) for v in views], round_


def test_pull_run_stops_before_each_kind_of_unit():
    """One run per stop rule, with the stop at a known unit."""
    rng = random.Random(22)
    seg, units = build_queue(rng, 32 * 1024, b"TopicS", 1, 500, dirty=0.0, other=0.0)
    seg_py = bytearray(seg)
    n = len(units)
    assert n >= 8
    blob = b"".join(units)
    sizes = [CQ_UNIT.unpack(u)[1] for u in units]
    offsets = [CQ_UNIT.unpack(u)[0] for u in units]
    full = BASE + len(seg)

    def run(units_blob=blob, seg_arg=seg, visible_end=full, log_min=0, max_bytes=1 << 40, taken=0, require=False,
            topic="TopicS", queue_id=1, queue_offset=500):
        return same_pull(units_blob, 0, n, seg_arg, BASE, visible_end, log_min, topic, queue_id, queue_offset,
                         max_bytes, taken, require)

    assert run()[1] == n
    for bad in (BLANK_UNIT, CQ_UNIT.pack(offsets[4], 0, 0), CQ_UNIT.pack(-1, sizes[4], 0),
                CQ_UNIT.pack(offsets[5], sizes[5], 0), CQ_UNIT.pack(offsets[4], sizes[4] + 1, 0)):
        assert run(units_blob=blob[:80] + bad + blob[100:])[1] == 4
    assert run(visible_end=offsets[4] + sizes[4] - 1)[1] == 4
    assert run(visible_end=offsets[4] + sizes[4])[1] == 5
    assert run(log_min=offsets[0] + 1)[1] == 0
    assert run(seg_arg=seg[:offsets[4] - BASE + sizes[4] - 1])[1] == 4
    assert run(max_bytes=sum(sizes[:4]))[1:] == (4, sum(sizes[:4]))
    assert run(max_bytes=sum(sizes[:4]) - 1)[1] == 3
    assert run(max_bytes=0)[1:] == (1, sizes[0])                        # the first message is always taken
    assert run(max_bytes=0, taken=1)[1:] == (0, 1)
    assert run(max_bytes=sum(sizes[:4]) + 10, taken=10)[1:] == (4, sum(sizes[:4]) + 10)
    assert run(topic="TopicX")[1] == 0
    assert run(topic="Topic\ud800")[1] == 0                               # a str no record can hold
    assert run(queue_id=2)[1] == 0
    assert run(queue_offset=501)[1] == 0
    seg_py[offsets[6] - BASE + 100] ^= 1                                 # damage: CRC mismatch
    assert run(seg_arg=seg_py)[1] == 6
    assert run(taken=2 ** 80, max_bytes=2 ** 81)[1:] == (n, 2 ** 80 + sum(sizes))  # huge ints, exactly
    assert run(taken=2 ** 81, max_bytes=2 ** 80)[1:] == (0, 2 ** 81)
    assert run(taken=-2 ** 90)[1:] == (n, -2 ** 90 + sum(sizes))


def test_pull_run_text_that_is_not_plain():
    """Non-UTF-8 property text and duplicate names stop the run; everything UTF-8 passes."""
    cases = [
        (b"TAGS\x01T\xc3\xa9\x02KEYS\x01a \xe4\xb8\xad\x02x\x01\xf0\x9f\x98\x80\x02", True),
        (b"TAGS\x01T\xff\x02", False), (b"a\x01\xed\xa0\x80\x02", False), (b"a\x01\xc0\xaf\x02", False),
        (b"a\x01\xf4\x90\x80\x80\x02", False), (b"a\x01\xe2\x82\x02", False), (b"\xff\x02", False),
        (b"a\x01\xf4\x8f\xbf\xbf\x02", True), (b"a\x01\xef\xbf\xbf\x02b\x01\xe0\xa0\x80\x02", True),
        (b"a\x01b\x02a\x01c\x02", False), (b"TAGS\x01a\x02TAGS\x01b\x02", False),
        (b"KEYS\x01a\x02KEYS\x01b\x02", False), (b"a\x01\x02a\x01c\x02", True), (b"a\x02a\x01c\x02", True),
        (b"\x01a\x02\x01b\x02", True), (b"a\x01b\x01c\x02", True),
        ("".join(f"n{i}\x01v\x02" for i in range(40)).encode(), True),
        ("".join(f"n{i}\x01v\x02" for i in range(40)).encode() + b"n7\x01w", False),
        (b"KEYS\x01" + b" ".join(b"k%d" % i for i in range(20)) + b"\x02", True),
        (b"v\x01" + b"x" * 300 + b"\x02", True),
    ]
    for props, plain in cases:
        for with_crc in (False, True):
            seg_py, seg_c = bytearray(4096), bytearray(4096)
            offsets, end = encode_both(seg_py, seg_c, 0, BASE, b"TopicU", 0, 0, T0, STORE_HOST, BORN_HOST, with_crc,
                                       [(b"body", props, 0, T0), (b"next", b"", 0, T0)])
            units = b"".join(CQ_UNIT.pack(o, struct.unpack_from(">i", seg_c, o - BASE)[0], 0) for o in offsets)
            result = same_pull(units, 0, 2, seg_c, BASE, BASE + end, 0, "TopicU", 0, 0, 1 << 20, 0, False)
            assert result[1] == (2 if plain else 0), props


def test_pull_run_every_flipped_byte():
    props = b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01ABCDEF\x02a\x01b\x02"
    for with_crc in (False, True):
        seg_py, seg_c = bytearray(1024), bytearray(1024)
        offsets, end = encode_both(seg_py, seg_c, 0, BASE, b"TopicF", 1, 2, T0, STORE_HOST, BORN_HOST, with_crc,
                                   [(b"hello", props, 0, T0), (b"world", props, 0, T0)])
        units = b"".join(CQ_UNIT.pack(o, struct.unpack_from(">i", seg_c, o - BASE)[0], 0) for o in offsets)
        size = struct.unpack_from(">i", seg_c, offsets[1] - BASE)[0]
        for at in range(offsets[1] - BASE, offsets[1] - BASE + size):
            for mask in (0x01, 0x80, 0xFF):
                seg_c[at] ^= mask
                for require in (False, True):
                    same_pull(units, 0, 2, seg_c, BASE, BASE + end, 0, "TopicF", 1, 2, 1 << 20, 0, require)
                seg_c[at] ^= mask


def test_pull_run_large_fields_and_buffers():
    """bin32 bodies, str16 topics and map16 properties; mmap, bytes and memoryview buffers."""
    props = ("".join(f"name{i}\x01{'é' * i}\x02" for i in range(20)) + "TAGS\x01" + "t" * 300 + "\x02").encode()
    items = [(b"b" * 70_000, props, 0, T0), (b"", b"", 0, T0), (b"c" * 300, props, -7, -1)]
    seg_py, seg_c = bytearray(160 * 1024), bytearray(160 * 1024)
    offsets, end = encode_both(seg_py, seg_c, 8, 0, b"L" * 300, 9, 2 ** 33, T0, STORE_HOST, BORN_HOST, True, items)
    units = b"".join(CQ_UNIT.pack(o, struct.unpack_from(">i", seg_c, o)[0], 0) for o in offsets)
    with mmap.mmap(-1, len(seg_c)) as mm, mmap.mmap(-1, len(units)) as mm_units:
        mm[:] = seg_c
        mm_units[:] = units
        for seg, unit_buf in ((seg_c, units), (bytes(seg_c), memoryview(units)), (mm, mm_units),
                              (memoryview(seg_c), bytearray(units))):
            maps, count, _taken = same_pull(unit_buf, 0, 3, seg, 0, end, 0, "L" * 300, 9, 2 ** 33, 1 << 30, 0, True)
            assert count == 3
            assert decoded_run(maps, count) == expected_views(units, 3, seg_c, 0, end, True)


def test_pull_run_bad_arguments():
    rng = random.Random(23)
    seg, units = build_queue(rng, 8 * 1024, b"TopicB", 0, 0, dirty=0.0, other=0.0)
    blob = b"".join(units)
    n = len(units)
    good = [blob, 0, n, seg, BASE, BASE + len(seg), 0, "TopicB", 0, 0, 1 << 20, 0, False]
    assert c.pull_run(*good)[1] == n
    for i, bad in ((1, -20), (1, 1), (2, n + 1), (1, len(blob) + 20), (1, 2 ** 70)):
        args = list(good)
        args[i] = bad
        with pytest.raises(ValueError):
            c.pull_run(*args)
    for i, bad in ((0, "units"), (3, "segment"), (7, b"TopicB"), (4, 1.5), (10, "big"), (11, None), (8, "0")):
        args = list(good)
        args[i] = bad
        with pytest.raises(TypeError):
            c.pull_run(*args)
    with pytest.raises(TypeError):
        c.pull_run(*good[:12])
    for count in (0, -3):                                 # nothing to walk: as the reference, nothing is read
        args = list(good)
        args[1:3] = [len(blob) + 100, count]
        assert c.pull_run(*args) == py.pull_run(*args) == (b"", 0, 0)
    # pull_objects: a factory that is not callable, one that refuses, too few arguments
    with pytest.raises(TypeError):
        c.pull_objects("Message", True, *good)
    with pytest.raises(TypeError):
        c.pull_objects(Message, True, *good[:12])

    def refusing(**_fields: object) -> None:
        raise LookupError("the factory's own error")

    for module in (c, py):
        with pytest.raises(LookupError, match="the factory's own error"):
            module.pull_objects(refusing, False, *good)
