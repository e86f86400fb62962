"""IndexFiles read while they are written: the publication protocol of engine/services/front/key_lookup.py.

The index builder stores an item, its slot (a release store), then the header and its count
(a release store): the count is the one point where an item is added. The front loads the
count with acquire, then the slot with acquire, and answers only items below that count
(``codec.index_header``, ``codec.index_select``). These tests show an item with its slot but
no count is not answered until the count covers it, hold the compiled reader to its Python
twin, and run a real writer process against a reader: every key the reader's acquired count
covers is found with its offset, and none past it.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine import codec_py as py
from engine.layout import INDEX_HEADER, INDEX_ITEM, INDEX_SLOT, index_file_bytes, index_key_hash
from engine.store.index_file import IndexFile, IndexService

try:
    from engine import _codec as c
except ImportError:
    c = None

pytestmark = pytest.mark.timeout(120)
compiled = pytest.mark.skipif(c is None, reason="engine._codec is not built")

SLOTS, ITEMS = 64, 20_000
REPO = Path(__file__).resolve().parents[2]


def filled(rng: random.Random, keys: int) -> bytearray:
    buf = bytearray(index_file_bytes(hash_slot_count=SLOTS, index_count=ITEMS))
    for n in range(keys):
        py.index_put_keys(buf, SLOTS, ITEMS, "t#", [f"k{rng.randint(0, 50)}"], n * 100, 1_700_000_000_000 + n * 7)
    return buf


@compiled
def test_the_compiled_reader_agrees_with_its_twin() -> None:
    rng = random.Random(5)
    for keys in (0, 1, 40, 3_000):
        buf = filled(rng, keys)
        assert c.index_header(buf) == py.index_header(buf) == INDEX_HEADER.unpack_from(buf, 0)
        begin_ts, count = INDEX_HEADER.unpack_from(buf, 0)[0], INDEX_HEADER.unpack_from(buf, 0)[5]
        for _ in range(200):
            counted = rng.choice([count, rng.randint(0, count + 2)])  # a header read before the last items
            args = (SLOTS, ITEMS, counted, index_key_hash(f"t#k{rng.randint(0, 60)}"), begin_ts, rng.randint(0, 64),
                    rng.choice([0, 1_700_000_000_000 + rng.randint(0, 30_000)]),
                    rng.choice([1 << 62, 1_700_000_000_000 + rng.randint(0, 30_000)]))
            assert c.index_select(buf, *args) == py.index_select(buf, *args)


@compiled
def test_the_compiled_reader_survives_garbage_as_its_twin_does() -> None:
    rng = random.Random(6)
    for _ in range(200):
        buf = bytearray(rng.randbytes(index_file_bytes(hash_slot_count=SLOTS, index_count=64)))
        args = (SLOTS, 64, rng.randint(-5, 70), rng.randint(0, 1 << 31 - 1), rng.randint(-(1 << 40), 1 << 40), 16,
                0, 1 << 62)
        assert c.index_select(buf, *args) == py.index_select(buf, *args)
    with pytest.raises(ValueError):
        c.index_select(bytearray(100), SLOTS, ITEMS, ITEMS, 1, 0, 4, 0, 1)


T0 = 1_700_000_000_000
TWINS = [pytest.param(py, id="python"), pytest.param(c, id="compiled", marks=compiled)]


def half_add(buf, key: str, offset: int, store_ms: int) -> int:
    """What ``index_put_keys`` stores before the count: the item, then its slot; the item's number."""
    begin_ts, *_rest, count = INDEX_HEADER.unpack_from(buf, 0)
    key_hash = index_key_hash(key)
    slot_pos = INDEX_HEADER.size + key_hash % SLOTS * INDEX_SLOT.size
    (previous,) = INDEX_SLOT.unpack_from(buf, slot_pos)
    INDEX_ITEM.pack_into(buf, INDEX_HEADER.size + SLOTS * INDEX_SLOT.size + count * INDEX_ITEM.size, key_hash, offset,
                         (store_ms - begin_ts) // 1000, previous)
    INDEX_SLOT.pack_into(buf, slot_pos, count)
    return count


def publish(buf, offset: int, store_ms: int) -> None:
    """What ``index_put_keys`` stores last: the header that counts the half-added item."""
    begin_ts, _end_ts, begin_phy, _end_phy, used, count = INDEX_HEADER.unpack_from(buf, 0)
    INDEX_HEADER.pack_into(buf, 0, begin_ts, store_ms, begin_phy, offset, used, count + 1)


def same_bucket(key: str) -> str:
    return next(f"t#{n}" for n in range(10_000) if f"t#{n}" != key and
                index_key_hash(f"t#{n}") % SLOTS == index_key_hash(key) % SLOTS)


@pytest.mark.parametrize("twin", TWINS)
def test_an_item_with_its_slot_is_answered_only_once_the_count_covers_it(twin) -> None:
    buf = bytearray(index_file_bytes(hash_slot_count=SLOTS, index_count=ITEMS))
    older, newer = "t#older", same_bucket("t#older")
    assert twin.index_put_keys(buf, SLOTS, ITEMS, "", [older], 100, T0) == 1

    def answer(key: str) -> list[int]:
        begin_ts, *_rest, count = twin.index_header(buf)
        return twin.index_select(buf, SLOTS, ITEMS, count, index_key_hash(key), begin_ts, 8, 0, 1 << 62)

    item = half_add(buf, newer, 200, T0 - 5_000)  # a half-added item may hold any time
    assert INDEX_SLOT.unpack_from(buf, INDEX_HEADER.size + index_key_hash(newer) % SLOTS * INDEX_SLOT.size)[0] == item
    assert answer(newer) == []      # the slot leads to it, the count does not cover it
    assert answer(older) == [100]   # reached through the uncounted item's prev
    # the uncounted item's time, before the range, does not end the walk
    assert twin.index_select(buf, SLOTS, ITEMS, item, index_key_hash(older), T0, 8, T0, 1 << 62) == [100]
    publish(buf, 200, T0 - 5_000)
    assert answer(newer) == [200]
    assert answer(older) == [100]


def test_the_front_answers_a_key_after_the_builder_publishes_its_count(tmp_path: Path) -> None:
    builder = IndexService(tmp_path, hash_slot_count=SLOTS, index_count_max=ITEMS, writable=True)
    front = IndexService(tmp_path, hash_slot_count=SLOTS, index_count_max=ITEMS, writable=False)
    assert builder.build("t", ["a"], 100, T0) == 1
    mm = builder.newest().mapped.mm
    half_add(mm, "t#b", 200, T0 + 1_000)
    front.follow_writer()
    assert front.query("t", "b", count_max=4, begin_ms=0, end_ms=1 << 62) == []
    assert front.query("t", "a", count_max=4, begin_ms=0, end_ms=1 << 62) == [100]
    publish(mm, 200, T0 + 1_000)
    assert front.query("t", "b", count_max=4, begin_ms=0, end_ms=1 << 62) == []  # the header it last read
    front.follow_writer()
    assert front.query("t", "b", count_max=4, begin_ms=0, end_ms=1 << 62) == [200]
    front.close()
    builder.close()


def test_a_relisting_reads_again_the_headers_of_the_files_kept_mapped(tmp_path: Path) -> None:
    builder = IndexService(tmp_path, hash_slot_count=8, index_count_max=6, writable=True)
    front = IndexService(tmp_path, hash_slot_count=8, index_count_max=6, writable=False)
    for n in range(3):
        builder.build("t", [f"k{n}"], n * 100, T0 + n)
    front.follow_writer()
    assert front.query("t", "k2", count_max=4, begin_ms=0, end_ms=1 << 62) == [200]
    for n in range(3, 7):  # fills the first file (items 1..5) and starts a second
        builder.build("t", [f"k{n}"], n * 100, T0 + n)
    assert builder.file_count == 2
    front.refresh()  # as after retention: the first file, mapped, is no longer the newest
    front.follow_writer()
    assert front.query("t", "k4", count_max=4, begin_ms=0, end_ms=1 << 62) == [400]
    assert front.query("t", "k6", count_max=4, begin_ms=0, end_ms=1 << 62) == [600]
    front.close()
    builder.close()


WRITER = """
import sys
from pathlib import Path
from engine.store.index_file import IndexFile, IndexService
index = IndexService(Path(sys.argv[1]), hash_slot_count={slots}, index_count_max={items}, writable=True)
for n in range(int(sys.argv[2])):
    assert index.build("t", [f"key-{{n}}"], n * 100 + 7, 1_700_000_000_000 + n) == 1
    if n == 0:
        print("started", flush=True)
    sum(range(3000))  # about as slow as the index builder per key: the reader runs alongside
index.flush()
"""


@contextmanager
def writing(script: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``script`` in a process of its own, once it printed "started"; killed if still running at the end."""
    writer = subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"started\n"
        yield writer
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        writer.stdout.close()  # type: ignore[union-attr]


def test_a_reader_finds_every_key_the_header_counts_and_none_past_it_while_a_writer_appends(tmp_path: Path) -> None:
    keys = 19_000
    with writing(WRITER.format(slots=SLOTS, items=ITEMS), str(tmp_path), str(keys)) as writer:
        reader = IndexService(tmp_path, hash_slot_count=SLOTS, index_count_max=ITEMS, writable=False)
        rng = random.Random(7)
        checked = while_writing = 0
        deadline = time.monotonic() + 60
        while writer.poll() is None or checked < 2_000:
            assert time.monotonic() < deadline
            reader.follow_writer()
            counted = reader.newest().index_count - 1  # items 1 .. count-1: key-0 .. key-(count-2)
            if counted < 1:
                continue
            n = rng.randrange(counted)
            found = reader.query("t", f"key-{n}", count_max=4, begin_ms=0, end_ms=1 << 62)
            assert found == [n * 100 + 7], f"key-{n} of {counted} counted: {found}"
            n = counted + rng.randrange(3)  # written or not by now: past the count read, never answered
            found = reader.query("t", f"key-{n}", count_max=4, begin_ms=0, end_ms=1 << 62)
            assert found == [], f"key-{n} of {counted} counted: {found}"
            checked += 1
            while_writing += writer.poll() is None
        assert writer.wait(30) == 0
        assert checked >= 2_000 and while_writing >= 100, (checked, while_writing)
        reader.close()


BATCH_WRITER = """
import sys
from pathlib import Path
from engine.codec_py import pack_entry
from engine.store.index_file import IndexService
index = IndexService(Path(sys.argv[1]), hash_slot_count={slots}, index_count_max={items}, writable=True)
print("started", flush=True)
for first in range(0, {records}, 1000):  # the index builder's way: a DispatchBatch's packed entries in one call
    index.build_records(b"".join(pack_entry(("t", 0, n, n * 100 + 7, 100, 0, 1_700_000_000_000 + n,
                                             [f"key-{{n}}-{{k}}" for k in range(n % 3 + 1)]))
                                 for n in range(first, first + 1000)))
"""


@compiled
def test_a_batch_put_killed_midway_leaves_the_items_the_record_by_record_path_writes(tmp_path: Path) -> None:
    """SIGKILL the C batch path (``build_records`` over packed entries) at a random moment: once repaired, the file is
    byte for byte the record-by-record Python path's (``codec_py.index_put_keys``) stopped after as
    many items, and the restart goes on from the record the header names."""
    records, items = 20_000, 60_000
    with writing(BATCH_WRITER.format(slots=SLOTS, items=items, records=records), str(tmp_path)) as writer:
        reader = IndexService(tmp_path, hash_slot_count=SLOTS, index_count_max=items, writable=False)
        target, deadline = random.randrange(10, records), time.monotonic() + 60  # a new moment each run
        while writer.poll() is None:  # until the writer has put about `target` items
            assert time.monotonic() < deadline
            reader.follow_writer()
            if reader.file_count and reader.newest().index_count > target:
                writer.kill()
        assert writer.wait(30) == -9, f"killed before it put every record (about {target} items)"
        reader.close()
    killed = IndexService(tmp_path, hash_slot_count=SLOTS, index_count_max=items, writable=True)  # repairs
    counted = killed.newest().index_count
    assert counted > 1
    expected = IndexFile.create(tmp_path / "expected", hash_slot_count=SLOTS, index_count_max=items,
                                end_phy_offset=0, end_timestamp_ms=0)
    put, last = 1, -1
    for record, key in ((r, k) for r in range(records) for k in range(r % 3 + 1)):
        if put == counted:
            break
        py.index_put_keys(expected.mapped.mm, SLOTS, items, "t#", [f"key-{record}-{key}"], record * 100 + 7,
                          1_700_000_000_000 + record)
        put, last = put + 1, record * 100 + 7
    assert killed.newest().mapped.mm[:] == expected.mapped.mm[:], f"{counted} items counted"
    assert killed.newest().end_phy_offset == last, "the restart goes on from the record of the last item counted"
    expected.close()
    killed.close()


def test_a_packed_batch_builds_the_files_its_entries_build(tmp_path: Path) -> None:
    """``build_records`` over a dispatch batch's packed entries (a byte cursor) and over the same
    entries as tuples: the same files, named by the same records, the first run below
    ``min_offset`` skipped in both."""
    rng = random.Random(8)
    entries = [("tópic", 0, n, n * 100, 100, 0, 1_700_000_000_000 + n * 1000,
                [f"k{rng.randrange(50)}-é" for _ in range(rng.randint(1, 4))]) for n in range(300)]
    packed = b"".join(py.pack_entry(entry) for entry in entries)
    built = []
    for name, batch in (("tuples", entries), ("packed", packed)):
        index = IndexService(tmp_path / name, hash_slot_count=7, index_count_max=64, writable=True)
        added = index.build_records(batch, min_offset=entries[20][3])
        index.close()
        files = sorted(p for p in (tmp_path / name).rglob("*") if p.is_file())
        built.append((added, {p.name: p.read_bytes() for p in files}))
    assert built[0] == built[1] and len(built[0][1]) > 3, "several files filled"
    assert built[0][0] == sum(len(entry[7]) for entry in entries[20:])
