"""Names a client chooses: one validator per kind, and every path uses it.

RocketMQ's rule for topic and group names is a *full* match of
``[%|a-zA-Z0-9_-]+`` (TopicValidator, ``Pattern.matcher(...).matches()``).
Python's ``re.match(r"^...$")`` is not that: ``$`` also matches before a
final newline, so ``"orders\\n"`` would pass and become a directory named
with a newline. Every check here is ``fullmatch`` on an ASCII class.

| kind  | characters           | length     | refused with   |
|-------|----------------------|------------|----------------|
| topic | ``[%|a-zA-Z0-9_-]``  | 1..127     | INVALID_TOPIC  |
| group | ``[%|a-zA-Z0-9_-]``  | 1..255     | INVALID_FIELD  |

Both limits are RocketMQ's (``TopicValidator.TOPIC_MAX_LENGTH``, ``Validators.CHARACTER_MAX_LENGTH``).
A pop group's dead-letter topic is ``%DLQ%`` + group, a topic name, so it must fit in 127
characters: up to a group of 122 it is exactly that, as in RocketMQ; a longer group's is
``%DLQ%``, the group's first 105 characters, ``-`` and 16 hex digits of the group's SHA-256
(``dead_letter_topic``). RocketMQ itself would write a 260-character topic there, which its
own record format (one byte of topic length) cannot hold. The engine makes no ``%RETRY%``
topics: a pop redelivers from the queue itself.

File and queue directory names are ASCII decimal (``is_decimal``).

Keys, tags and property names are free text except RocketMQ's separators
(``engine/store/records.py``): a newline in a key is data, not a path.
"""

from __future__ import annotations

import hashlib
import re

from engine.errors import ErrorCode, RequestError

TOPIC_NAME_CHARS_MAX = 127
GROUP_NAME_CHARS_MAX = 255  # RocketMQ's; the dead-letter topic of a long one is shortened
DEAD_LETTER_PREFIX = "%DLQ%"
_DEAD_LETTER_DIGEST_CHARS = 16  # hex digits of the group's SHA-256 in a shortened dead-letter topic
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
    """The dead-letter topic of a pop group: RocketMQ's ``%DLQ%`` + group when that is a topic name's
    length; for a longer group, ``%DLQ%``, the group's start, ``-`` and a digest of the whole group."""
    topic = DEAD_LETTER_PREFIX + group
    if len(topic) <= TOPIC_NAME_CHARS_MAX:
        return topic
    digest = hashlib.sha256(group.encode()).hexdigest()[:_DEAD_LETTER_DIGEST_CHARS]
    kept = TOPIC_NAME_CHARS_MAX - len(DEAD_LETTER_PREFIX) - 1 - _DEAD_LETTER_DIGEST_CHARS
    topic = f"{DEAD_LETTER_PREFIX}{group[:kept]}-{digest}"
    assert len(topic) == TOPIC_NAME_CHARS_MAX
    return topic


def validate_group(name: str) -> str:
    """Return ``name`` if it is a valid consumer group; RequestError(INVALID_FIELD) otherwise."""
    if not is_name(name, GROUP_NAME_CHARS_MAX):
        raise RequestError(ErrorCode.INVALID_FIELD,
                           f"the group name {name!r} must consist of the characters %|a-zA-Z0-9_- only "
                           f"and have 1 to {GROUP_NAME_CHARS_MAX} characters")
    return name
