"""Coverage-guided, in-process fuzzing of the decoders with hypothesis: records, properties,
message ids, ConsumeQueue units, IndexFiles, and the C codec against its Python twin.

A decoder fed hostile bytes may refuse them only with its documented error (``RecordError``,
``ValueError`` for ids); anything else escaping is a bug. The C codec must give the Python
reference's answer on every input. Bounded for CI (``max_examples``); raise
``RMQPY_FUZZ_EXAMPLES`` for a longer run.
"""

from __future__ import annotations

import mmap
import os
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import StoreConfig
from engine.layout import (
    CQ_UNIT,
    INDEX_HEADER,
    RecordError,
    decode_msg_id,
    decode_properties,
    decode_record,
    index_file_bytes,
    verify_record,
)
from engine.offline.check import check_index_file
from engine.store.commit_log import CommitLogReader
from engine.store.consume_queue import Unit
from tests.unit.test_codec import BASE, build_segment, c, same_scan, same_views

pytestmark = pytest.mark.timeout(120)

EXAMPLES = int(os.environ.get("RMQPY_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=os.environ.get("RMQPY_FUZZ_EXAMPLES") is None)
SEGMENT, STARTS = build_segment(random.Random(2026), 64 * 1024, batches=40, with_crc=None)
# Edits to a valid segment: (position, byte) pairs, biased to record heads.
EDITS = st.lists(st.tuples(st.one_of(st.sampled_from(STARTS).flatmap(lambda s: st.integers(s, s + 80)),
                                     st.integers(0, len(SEGMENT) - 1)), st.integers(0, 255)), min_size=1, max_size=8)


def edited(edits: list[tuple[int, int]]) -> bytearray:
    buf = bytearray(SEGMENT)
    for pos, value in edits:
        buf[pos] = value
    return buf


def decode_or_refuse(buf, pos: int, *, check_crc: bool) -> None:
    try:
        decode_record(buf, pos, limit=len(buf), base_offset=BASE, check_crc=check_crc, require_record_crc=check_crc)
    except RecordError:
        pass
    try:
        verify_record(buf, pos, limit=len(buf), base_offset=BASE, require_record_crc=check_crc)
    except RecordError:
        pass


@FUZZ
@given(st.binary(max_size=2048), st.booleans())
def test_record_decoders_refuse_garbage_only_with_record_error(data: bytes, check_crc: bool) -> None:
    decode_or_refuse(data, 0, check_crc=check_crc)


@FUZZ
@given(EDITS, st.booleans())
def test_edited_records_are_refused_or_decoded_never_crash(edits: list[tuple[int, int]], check_crc: bool) -> None:
    buf = edited(edits)
    for start in STARTS:
        decode_or_refuse(buf, start, check_crc=check_crc)


@pytest.mark.skipif(c is None, reason="engine._codec is not built")
@FUZZ
@given(EDITS, st.integers(0, len(SEGMENT)))
def test_the_c_codec_agrees_with_its_python_twin_on_edited_segments(edits: list[tuple[int, int]], limit: int) -> None:
    buf = edited(edits)
    same_scan(buf, 0, limit)
    for start in STARTS[:8]:
        same_views(buf, start, limit)


@pytest.mark.skipif(c is None, reason="engine._codec is not built")
@FUZZ
@given(st.binary(min_size=0, max_size=600), st.integers(0, 600))
def test_the_c_codec_agrees_with_its_python_twin_on_garbage(data: bytes, limit: int) -> None:
    limit = min(limit, len(data))
    same_scan(data, 0, limit)
    same_views(data, 0, limit)


@FUZZ
@given(st.binary(max_size=512))
def test_properties_decode_any_bytes(data: bytes) -> None:
    decoded = decode_properties(data)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in decoded.items())


@FUZZ
@given(st.text(max_size=40))
def test_message_ids_are_refused_with_value_error(text: str) -> None:
    try:
        decode_msg_id(text)
    except ValueError:
        return
    assert len(text) == 32 and all(ch in "0123456789abcdefABCDEF" for ch in text), text


@FUZZ
@given(st.binary(min_size=CQ_UNIT.size, max_size=CQ_UNIT.size))
def test_any_twenty_bytes_are_a_unit_and_its_predicates_hold(data: bytes) -> None:
    unit = Unit(*CQ_UNIT.unpack(data))
    assert not (unit.is_blank and unit.is_plausible)


@FUZZ
@given(st.binary(max_size=4096), st.integers(0, 3))
def test_index_check_reports_damage_and_never_crashes(tmp_path_factory, data: bytes, fill: int) -> None:
    config = StoreConfig.test_min().replace(index_hash_slot_count=16, index_item_count_max=32)
    size = index_file_bytes(hash_slot_count=16, index_count=32)
    blob = bytearray(size)
    blob[:min(size, len(data))] = data[:size]
    if fill:  # a header whose count says how many items to walk
        struct.pack_into(">i", blob, INDEX_HEADER.size - 4, fill * 11)
    store = tmp_path_factory.mktemp("index-fuzz")
    reader = CommitLogReader.for_config(store, config)
    try:
        with mmap.mmap(-1, size) as mm:
            mm[:] = bytes(blob)
            findings = check_index_file("00000000000000000000", mm, reader, config, 0)
    finally:
        reader.segments.close()
    assert all(f.area == "index" for f in findings)
