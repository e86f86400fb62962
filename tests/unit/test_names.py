"""Client-chosen names: one validator per kind, a full match, ASCII only."""

from __future__ import annotations

import pytest

from engine.errors import ErrorCode, RequestError
from engine.names import is_decimal, validate_group, validate_topic
from engine.store.consume_queue import list_queues

pytestmark = pytest.mark.timeout(30)

# `$` in a re.match pattern matches before a final newline: each of these passed once.
BAD = ["name\n", "name\r", "name\r\n", "\nname", "na\nme", "name\x00", "тема", "name٣", "a b", "a/b", "..", "../x",
       "", "x" * 128, "nam\u00e9", "ｎａｍｅ"]  # noqa: RUF001 - fullwidth on purpose


@pytest.mark.parametrize("name", BAD)
def test_topic_names_must_match_whole(name: str) -> None:
    with pytest.raises(RequestError) as info:
        validate_topic(name)
    assert info.value.code == ErrorCode.INVALID_TOPIC


@pytest.mark.parametrize("name", [*(n for n in BAD if n != "x" * 128), "g" * 256])  # 128 is a group's length
def test_group_names_must_match_whole(name: str) -> None:
    with pytest.raises(RequestError) as info:
        validate_group(name)
    assert info.value.code == ErrorCode.INVALID_FIELD


@pytest.mark.parametrize("name", ["orders", "a", "A-b_c|d%e", "9" * 127])
def test_valid_topic_names_pass(name: str) -> None:
    assert validate_topic(name) == name


def test_reserved_topics_are_refused() -> None:
    for name in ("TBW102", "rmq_sys_wheel", "%RETRY%g", "%DLQ%g", "SCHEDULE_TOPIC_XXXX"):
        with pytest.raises(RequestError):
            validate_topic(name)


def test_decimal_file_names_are_ascii_digits_only() -> None:
    assert is_decimal("00000000000000000000")
    for text in ("٣", "³", "1\n", "", "-1", "1.0"):
        assert not is_decimal(text), text


def test_queue_directories_with_newlines_or_unicode_digits_are_not_queues(tmp_path) -> None:
    root = tmp_path / "consumequeue"
    for topic, queue in [("good", "0"), ("bad\n", "0"), ("good", "٣"), ("good", "1\n")]:
        (root / topic / queue).mkdir(parents=True)
    assert list_queues(tmp_path) == [("good", 0)]


def test_a_long_groups_dead_letter_topic_is_shortened_to_a_topic_name_and_stays_distinct() -> None:
    from engine.names import TOPIC_NAME_CHARS_MAX, dead_letter_topic, is_topic_name

    assert dead_letter_topic("g" * 122) == "%DLQ%" + "g" * 122  # RocketMQ's name while it fits
    names = {dead_letter_topic(group) for group in ("g" * 123, "g" * 255, "g" * 254 + "h", "h" + "g" * 254)}
    assert len(names) == 4
    assert all(len(name) == TOPIC_NAME_CHARS_MAX and is_topic_name(name) for name in names)
    assert validate_group("g" * 255) == "g" * 255
