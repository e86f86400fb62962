"""Names a client chooses: one validator per kind, and every path uses it.

RocketMQ's rule for topic and group names is a *full* match of
``[%|a-zA-Z0-9_-]+`` (TopicValidator, ``Pattern.matcher(...).matches()``).
Python's ``re.match(r"^...$")`` is not that: ``$`` also matches before a
final newline, so ``"orders\\n"`` would pass and become a directory named
with a newline. Every check here is ``fullmatch`` on an ASCII class.

| kind  | characters           | length     | refused with   |
|-------|----------------------|------------|----------------|
| topic | ``[%|a-zA-Z0-9_-]``  | 1..127     | INVALID_TOPIC  |
| group | ``[%|a-zA-Z0-9_-]``  | 1..120     | INVALID_FIELD  |

File and queue directory names are ASCII decimal (``is_decimal``).

Keys, tags and property names are free text except RocketMQ's separators
(``engine/store/records.py``): a newline in a key is data, not a path.
"""

from __future__ import annotations

import re

from engine.errors import ErrorCode, RequestError

TOPIC_NAME_CHARS_MAX = 127
GROUP_NAME_CHARS_MAX = 120  # RocketMQ embeds groups in %RETRY%group names
_NAME_CHARS = re.compile(r"[%|a-zA-Z0-9_-]+", re.ASCII)
RESERVED_TOPICS = frozenset({"TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest_SYS", "OFFSET_MOVED_EVENT",
                             "SELF_TEST_TOPIC", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
                             "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC"})
RESERVED_TOPIC_PREFIXES = ("rmq_sys_", "%RETRY%", "%DLQ%")


def is_name(text: object, chars_max: int) -> bool:
    """True if ``text`` is a string of 1..``chars_max`` name characters, and nothing else."""
    return isinstance(text, str) and 0 < len(text) <= chars_max and _NAME_CHARS.fullmatch(text) is not None


def is_topic_name(text: object) -> bool:
    """The characters and length of a topic (reserved names included): for directory listings."""
    return is_name(text, TOPIC_NAME_CHARS_MAX)


def is_decimal(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also takes "٣" and "³", which ``int`` then reads or refuses."""
    return text.isascii() and text.isdigit()


def validate_topic(name: str) -> str:
    """Return ``name`` if it is a valid user topic; RequestError(INVALID_TOPIC) otherwise."""
    if not name:
        raise RequestError(ErrorCode.INVALID_TOPIC, "the topic name is empty")
    if len(name) > TOPIC_NAME_CHARS_MAX:
        raise RequestError(ErrorCode.INVALID_TOPIC,
                           f"the topic name is longer than {TOPIC_NAME_CHARS_MAX} characters")
    if not is_topic_name(name):
        raise RequestError(ErrorCode.INVALID_TOPIC,
                           f"the topic name {name!r} must consist of the characters %|a-zA-Z0-9_- only")
    if name in RESERVED_TOPICS or name.startswith(RESERVED_TOPIC_PREFIXES):
        raise RequestError(ErrorCode.INVALID_TOPIC, f"the topic name {name!r} is reserved for the system")
    return name


def dead_letter_topic(group: str) -> str:
    """The dead-letter topic of a pop group (RocketMQ's ``%DLQ%`` + group)."""
    return f"%DLQ%{group}"


def validate_group(name: str) -> str:
    """Return ``name`` if it is a valid consumer group; RequestError(INVALID_FIELD) otherwise."""
    if not is_name(name, GROUP_NAME_CHARS_MAX):
        raise RequestError(ErrorCode.INVALID_FIELD,
                           f"the group name {name!r} must consist of the characters %|a-zA-Z0-9_- only "
                           f"and have 1 to {GROUP_NAME_CHARS_MAX} characters")
    return name
