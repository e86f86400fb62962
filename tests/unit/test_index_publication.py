"""IndexFiles read while they are written: the publication protocol of engine/key_lookup.py.

The index builder stores an item, publishes its slot (a release store), then the header's
count; the front loads a slot or the count with an acquire load before it reads what it
leads to (``codec.index_select``, ``codec.index_header``). These tests hold the compiled
reader to its Python twin, and run a real writer process against a reader: every key the
reader's acquired header counts must be found, with its offset.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import codec_py as py
from engine.index_file import IndexService
from engine.layout import INDEX_HEADER, index_file_bytes, index_key_hash

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
        begin_ts = INDEX_HEADER.unpack_from(buf, 0)[0]
        for _ in range(200):
            args = (SLOTS, ITEMS, index_key_hash(f"t#k{rng.randint(0, 60)}"), begin_ts, rng.randint(0, 64),
                    rng.choice([0, 1_700_000_000_000 + rng.randint(0, 30_000)]),
                    rng.choice([1 << 62, 1_700_000_000_000 + rng.randint(0, 30_000)]))
            assert c.index_select(buf, *args) == py.index_select(buf, *args)


@compiled
def test_the_compiled_reader_survives_garbage_as_its_twin_does() -> None:
    rng = random.Random(6)
    for _ in range(200):
        buf = bytearray(rng.randbytes(index_file_bytes(hash_slot_count=SLOTS, index_count=64)))
        args = (SLOTS, 64, rng.randint(0, 1 << 31 - 1), rng.randint(-(1 << 40), 1 << 40), 16, 0, 1 << 62)
        assert c.index_select(buf, *args) == py.index_select(buf, *args)
    with pytest.raises(ValueError):
        c.index_select(bytearray(100), SLOTS, ITEMS, 1, 0, 4, 0, 1)


WRITER = """
import sys
from pathlib import Path
from engine.index_file import IndexService
index = IndexService(Path(sys.argv[1]), hash_slot_count={slots}, index_count_max={items}, writable=True)
for n in range(int(sys.argv[2])):
    assert index.build("t", [f"key-{{n}}"], n * 100 + 7, 1_700_000_000_000 + n) == 1
    if n == 0:
        print("started", flush=True)
    sum(range(3000))  # about as slow as the index builder per key: the reader runs alongside
index.flush()
"""


def test_a_reader_finds_every_key_the_header_counts_while_a_writer_appends(tmp_path: Path) -> None:
    keys = 19_000
    writer = subprocess.Popen([sys.executable, "-c", WRITER.format(slots=SLOTS, items=ITEMS), str(tmp_path),
                               str(keys)], cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"started\n"
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
            checked += 1
            while_writing += writer.poll() is None
        assert writer.wait(30) == 0
        assert checked >= 2_000 and while_writing >= 100, (checked, while_writing)
        reader.close()
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        writer.stdout.close()  # type: ignore[union-attr]
