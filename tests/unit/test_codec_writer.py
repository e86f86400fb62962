"""The writer's half of the codec: ``build_items`` and ``send_results``, compiled against reference.

Both must agree on every batch: the same items (bodies, encoded properties byte for
byte, flags, born timestamps), the same payload size, and the same first refused
message; ``records.build_items`` must then explain that refusal with the code the
rules name.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from engine import codec_py as py
from engine.config import StoreConfig
from engine.errors import ErrorCode, RequestError
from engine.ipc.protocol import SendMessage, SendResult
from engine.layout import HostAddress
from engine.store.records import UniqKeys, build_items, explain_refusal

try:
    from engine import _codec as c
except ImportError:  # no C compiler when the package was installed
    c = None

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(c is None, reason="engine._codec is not built (pip install -e . compiles it)"),
]

NOW = 1_700_000_000_000
CONFIG = StoreConfig()
TEXT = "abcXYZ019_-. é߀中😀"


def rand_text(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choice(TEXT) for _ in range(rng.randint(low, high)))


def rand_message(rng: random.Random, *, bad: bool) -> SendMessage:
    properties = {rand_text(rng, 1, 8): rand_text(rng, 1, 12) for _ in range(rng.randint(0, 4))}
    if rng.random() < 0.2:
        properties["UNIQ_KEY"] = rand_text(rng, 1, 20)
    fields = {"body": rng.randbytes(rng.randint(1, 300)), "properties": properties,
              "tags": rng.choice([None, "", rand_text(rng, 1, 10)]),
              "keys": [rand_text(rng, 1, 10).replace(" ", "_") for _ in range(rng.randint(0, 3))],
              "flag": rng.randint(-2**31, 2**31 - 1), "born_timestamp": rng.choice([None, NOW - 5])}
    if bad:
        trouble = rng.randrange(10)
        if trouble == 0:
            fields["body"] = b""
        elif trouble == 1:
            fields["properties"] = {**properties, "na\x01me": "v"}
        elif trouble == 2:
            fields["properties"] = {**properties, "name": "va\x02lue"}
        elif trouble == 3:
            fields["properties"] = {**properties, rng.choice(["KEYS", "TAGS", "__CRC32#", ""]): "v"}
        elif trouble == 4:
            fields["properties"] = {**properties, "empty": ""}
        elif trouble == 5:
            fields["tags"] = "t\x01ag"
        elif trouble == 6:
            fields["keys"] = [*fields["keys"], rng.choice(["", "a key", "k\x02"])]
        elif trouble == 7:
            fields["properties"] = {**properties, "big": "x" * CONFIG.properties_bytes_max}
        elif trouble == 8:
            fields["body"] = bytes(CONFIG.message_body_bytes_max + 1)
        else:
            fields["properties"] = {**properties, "big": "é" * (CONFIG.properties_bytes_max // 2 - 40)}
    return SendMessage(**fields)


def run_both(messages: list[SendMessage]):
    uniq = [f"{i:032X}" for i in range(len(messages))]
    args = (messages, CONFIG.message_body_bytes_max, CONFIG.properties_bytes_max, uniq, NOW)
    return py.build_items(*args), c.build_items(*args)


def test_random_batches_agree_item_for_item():
    rng = random.Random(7)
    for _ in range(300):
        messages = [rand_message(rng, bad=False) for _ in range(rng.randint(1, 20))]
        expected, got = run_both(messages)
        assert got == expected
        assert got[0] is not None and got[1] == sum(len(b) + len(p) for b, p, _f, _t in got[0])


def test_the_first_refused_message_is_the_same_and_explained():
    rng = random.Random(11)
    for _ in range(400):
        messages = [rand_message(rng, bad=rng.random() < 0.3) for _ in range(rng.randint(1, 8))]
        expected, got = run_both(messages)
        assert got == expected
        if got[0] is None:
            with pytest.raises(RequestError) as refused:
                explain_refusal(messages[got[1]], CONFIG)
            assert refused.value.code in (ErrorCode.MESSAGE_ILLEGAL, ErrorCode.INVALID_PROPERTY,
                                          ErrorCode.PROPERTIES_SIZE_EXCEEDED)


def test_properties_exactly_at_the_limit_pass_and_one_byte_more_is_refused():
    base = SendMessage(body=b"x", properties={"p": "v"}, keys=[], tags=None)
    overhead = len("p\x01v\x02" "q\x01\x02" "UNIQ_KEY\x01\x02") + 32 + 20  # + the value of q
    room = CONFIG.properties_bytes_max - overhead
    for message, ok in ((base, True),
                        (SendMessage(body=b"x", properties={"p": "v", "q": "y" * room}), True),
                        (SendMessage(body=b"x", properties={"p": "v", "q": "y" * (room + 1)}), False)):
        expected, got = run_both([message])
        assert got == expected
        assert (got[0] is not None) == ok


def test_build_items_through_records_explains_with_codes():
    host = HostAddress.parse("127.0.0.1", 10911)
    cases = [(SendMessage(body=b""), ErrorCode.MESSAGE_ILLEGAL),
             (SendMessage(body=b"x", keys=["a b"]), ErrorCode.INVALID_PROPERTY),
             (SendMessage(body=b"x", properties={"TAGS": "t"}), ErrorCode.INVALID_PROPERTY),
             (SendMessage(body=b"x", properties={"big": "x" * 40_000}), ErrorCode.PROPERTIES_SIZE_EXCEEDED)]
    for message, code in cases:
        with pytest.raises(RequestError) as refused:
            build_items([SendMessage(body=b"ok"), message], config=CONFIG, uniq_keys=UniqKeys(host, 1), now_ms=NOW)
        assert refused.value.code == code


@pytest.mark.parametrize("status,code", [("PUT_OK", 0), ("FLUSH_DISK_TIMEOUT", 2)])
def test_send_results_agree_and_decode_as_send_result_structs(status, code):
    offsets = [0, 1, 127, 128, 255, 65_536, 2**32, 2**40 + 7, 2**63 - 1]
    args = (offsets, 3, 41, NOW, "7F00000100002A9F", status, code)
    assert c.send_results(*args) == py.send_results(*args)
    decoded = msgspec.msgpack.decode(c.send_results(*args), type=list[SendResult])
    assert [(r.status, r.status_code, r.msg_id, r.queue_offset, r.commit_log_offset) for r in decoded] == \
        [(status, code, f"7F00000100002A9F{o:016X}", 41 + i, o) for i, o in enumerate(offsets)]
    assert c.send_results([], 0, 0, NOW, "AB", status, code) == py.send_results([], 0, 0, NOW, "AB", status, code)


@pytest.mark.parametrize("first", [0, 65_530, 2**32 - 3, 2**48 + 65_534])
def test_uniq_keys_agree_across_the_counter_halves(first):
    for now in (0, NOW, 2**32 + 5, -1):
        assert c.uniq_keys("7F0000013B2D", first, 9, now) == py.uniq_keys("7F0000013B2D", first, 9, now)


def test_bad_arguments_raise():
    with pytest.raises((TypeError, AttributeError)):
        c.build_items([object()], 10, 100, ["u"], NOW)
    with pytest.raises(ValueError):
        c.build_items([SendMessage(body=b"x")], 10, 100, [], NOW)
    with pytest.raises(ValueError):
        c.send_results([-1], 0, 0, NOW, "AB", "PUT_OK", 0)
    with pytest.raises(TypeError):
        c.uniq_keys(b"7F", 0, 1, NOW)
