"""Batches the client encodes (RocketMQ's MessageBatch body): ``batch_records`` on the client,
``batch_items`` in the writer, compiled against reference.

Both halves must agree with their Python twins on every batch and every damaged one (the
same bytes, the same items, the same first refused message), a batch must come out of
``batch_items`` as the very items ``build_items`` makes of the same messages, and every
refusal must be explained with the code the rules name.
"""

from __future__ import annotations

import random
import struct

import pytest

from engine import codec_py as py
from engine.config import StoreConfig
from engine.errors import ErrorCode, RequestError
from engine.ipc.protocol import SendMessage
from engine.layout import HostAddress
from engine.services.writer.log_appends import ENGINE_ONLY_PROPERTIES
from engine.store.records import UniqKeys, batch_items
from tests.unit import test_codec_writer
from tests.unit.test_codec_writer import NOW, c, rand_message, rand_text

pytestmark = test_codec_writer.pytestmark  # a timeout, and skipped without the compiled codec

CONFIG = StoreConfig()
PREFIX = "7F0000010001"  # a writer's uniq key prefix: ip and pid
REFUSED = ENGINE_ONLY_PROPERTIES


def items_both(records: bytes, *, born: int = NOW - 9, first: int = 40):
    args = (records, CONFIG.message_body_bytes_max, CONFIG.properties_bytes_max, PREFIX, first, NOW, born, REFUSED)
    return py.batch_items(*args), c.batch_items(*args)


def encoded(messages: list[SendMessage]) -> tuple[bytes, list[str]]:
    expected, got = py.batch_records(messages, "C11E47", 7), c.batch_records(messages, "C11E47", 7)
    assert got == expected
    assert got[0] is not None, got
    return got


def test_a_batch_comes_out_as_the_items_build_items_makes():
    rng = random.Random(3)
    for _ in range(300):
        messages = [rand_message(rng, bad=False) for _ in range(rng.randint(1, 20))]
        born = rng.choice([None, NOW - 5])
        messages = [SendMessage(body=m.body, tags=m.tags, keys=m.keys, properties=m.properties, flag=m.flag,
                                born_timestamp=born) for m in messages]
        records, ids = encoded(messages)
        expected, got = items_both(records, born=NOW if born is None else born)
        assert got == expected
        built = py.build_items(messages, CONFIG.message_body_bytes_max, CONFIG.properties_bytes_max, ids, NOW)
        assert got == built
        assert ids == [m.properties.get("UNIQ_KEY", f"C11E47{7 + i:016X}") for i, m in enumerate(messages)]


def test_messages_without_ids_get_the_writers():
    records, _ = encoded([SendMessage(body=b"a", properties={"UNIQ_KEY": "MINE"})])
    bare = struct.pack(">iiiii", 23, 0, 0, 5, 1) + b"b" + b"\x00\x00"
    expected, got = items_both(records + bare, first=65_541)
    assert got == expected
    [(_, mine, _, _), (body, theirs, flag, born)] = got[0]
    assert mine == b"UNIQ_KEY\x01MINE\x02"
    assert (body, flag, born) == (b"b", 5, NOW - 9)
    assert theirs == f"UNIQ_KEY\x01{py.uniq_keys(PREFIX, 65_542, 1, NOW)[0]}\x02".encode()


def damage(rng: random.Random, records: bytes, starts: list[int]) -> bytes:
    """One of the ways a batch can be wrong, in one of its messages."""
    at = rng.choice(starts)
    total, _m, _c, _f, body_len = struct.unpack_from(">iiiii", records, at)
    props_at = at + 22 + body_len
    kind = rng.randrange(10)
    if kind == 0:
        return records[:rng.randrange(len(records))]
    if kind == 1:  # TOTALSIZE or BODYLEN disagree
        field = rng.choice([at, at + 16])
        return records[:field] + struct.pack(">i", rng.choice([-1, 0, 1, total + 1, 2**31 - 1])) + records[field + 4:]
    if kind == 2:  # PROPLEN disagrees
        return records[:props_at - 2] + b"\xff\xff" + records[props_at:]
    swap = {3: b"REAL_TOPIC\x01t\x02", 4: b"__CRC32#\x011\x02", 5: b"KEYS\x01a  b\x02", 6: b"x\x01\xff\xfe\x02",
            7: b"x\x01a\x01b\x02", 8: b"\x01v\x02", 9: b"dup\x01a\x02dup\x01b\x02"}[kind]
    grown = len(swap)
    return (records[:at] + struct.pack(">i", total + grown) + records[at + 4:props_at - 2]
            + struct.pack(">H", total - 22 - body_len + grown) + swap + records[props_at:])


def test_damaged_batches_agree_and_are_explained():
    rng = random.Random(17)
    refused = 0
    for _ in range(500):
        messages = [rand_message(rng, bad=False) for _ in range(rng.randint(1, 6))]
        records, _ = encoded(messages)
        starts, at = [], 0
        while at < len(records):
            starts.append(at)
            at += struct.unpack_from(">i", records, at)[0]
        bad = damage(rng, records, starts)
        expected, got = items_both(bad)
        assert got == expected
        if got[0] is None:
            refused += 1
            with pytest.raises(RequestError) as why:
                batch_items(bad, config=CONFIG, uniq_keys=UniqKeys(HostAddress.parse("127.0.0.1", 1), 1),
                            now_ms=NOW, born_ms=None, refused_names=REFUSED)
            assert why.value.code in (ErrorCode.MESSAGE_ILLEGAL, ErrorCode.INVALID_PROPERTY,
                                      ErrorCode.PROPERTIES_SIZE_EXCEEDED), why.value
    assert refused > 400


@pytest.mark.parametrize(("tail", "code", "words"), [
    (b"", ErrorCode.MESSAGE_ILLEGAL, "cut short"),
    (struct.pack(">iiiii", 22, 0, 0, 0, 0) + b"\x00\x00", ErrorCode.MESSAGE_ILLEGAL, "cut short"),
    (struct.pack(">iiiii", 31, 0, 0, 0, 1) + b"x\x00\x08DELAY\x013\x02", ErrorCode.INVALID_PROPERTY, "DELAY"),
    (struct.pack(">iiiii", 30, 0, 0, 0, 1) + b"x\x00\x07KEYS\x01\x20\x02", ErrorCode.INVALID_PROPERTY, "KEYS"),
])
def test_each_refusal_names_its_message_and_its_rule(tail: bytes, code: ErrorCode, words: str):
    records, _ = encoded([SendMessage(body=b"ok")])
    bad = records + tail if tail else records[:-1]
    with pytest.raises(RequestError) as why:
        batch_items(bad, config=CONFIG, uniq_keys=UniqKeys(HostAddress.parse("127.0.0.1", 1), 1), now_ms=NOW,
                    born_ms=None, refused_names=REFUSED)
    assert why.value.code == code and words in why.value.message, why.value


def test_the_limits_hold_for_records_as_for_messages():
    big = SendMessage(body=b"x" * (CONFIG.message_body_bytes_max + 1))
    fat = SendMessage(body=b"x", properties={"p": "é" * (CONFIG.properties_bytes_max // 2)})
    for message, code in ((big, ErrorCode.MESSAGE_ILLEGAL), (fat, ErrorCode.PROPERTIES_SIZE_EXCEEDED)):
        records, _ = encoded([SendMessage(body=b"ok"), message])
        expected, got = items_both(records)
        assert got == expected == (None, 1)
        with pytest.raises(RequestError) as why:
            batch_items(records, config=CONFIG, uniq_keys=UniqKeys(HostAddress.parse("127.0.0.1", 1), 1),
                        now_ms=NOW, born_ms=None, refused_names=REFUSED)
        assert why.value.code == code


def test_random_bytes_never_crash_and_agree():
    rng = random.Random(5)
    for _ in range(2000):
        junk = rng.randbytes(rng.randint(0, 80))
        if rng.random() < 0.5 and len(junk) >= 4:  # a plausible TOTALSIZE
            junk = struct.pack(">i", len(junk)) + junk[4:]
        expected, got = items_both(junk)
        assert got == expected


def test_the_client_half_refuses_what_the_engine_would():
    rng = random.Random(23)
    for _ in range(300):
        messages = [rand_message(rng, bad=rng.random() < 0.3) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.1:
            messages.append(SendMessage(body=b"x", properties={"p": rand_text(rng, 1, 3) * 40_000}))
        expected, got = py.batch_records(messages, "AB", 0), c.batch_records(messages, "AB", 0)
        assert got == expected
        refused_by_build = py.build_items(messages, 2**62, 2**62, ["AB"] * len(messages), 0)[0] is None
        assert (got[0] is None) >= refused_by_build
    flagged = [SendMessage(body=b"x"), SendMessage(body=b"y", flag=2**31)]  # the constructor checks no range
    assert c.batch_records(flagged, "AB", 0) == py.batch_records(flagged, "AB", 0) == (None, 1)
