"""The system topics that hold messages on their way to their real topic, and the properties
that say where they go (RocketMQ's names: ``MessageConst``, ``TopicValidator``).

A delayed or timed message is stored at once in ``rmq_sys_wheel_timer`` queue 0, a
transactional one in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, each with its real topic and
queue in ``REAL_TOPIC``/``REAL_QID`` (RocketMQ's ``HookUtils#transformTimerMessage`` and
``TransactionalMessageBridge#parseHalfMessageInner``). Consumers never see these topics.
When the timer actor delivers a message, or the transaction actor commits one, it appends
a new record to the real topic: the same body, tags, keys and message id (``UNIQ_KEY``),
without the routing properties, and with ``ORIGIN_OFFSET``, the commit-log offset of the
record it was moved from. That property is how a restarted actor learns which moves are
already in the log, so that none is made twice. Decisions on half messages are op records
in ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` (tag ``d``, body: the half's queue offset, as RocketMQ).

Delay levels (RocketMQ 4's ``SCHEDULE_TOPIC_XXXX``) go through the timer as well: the level
becomes its deliver time, and ``DELAY`` keeps the level.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.layout import Record

TIMER_TOPIC = "rmq_sys_wheel_timer"
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
SYSTEM_TOPICS = (TIMER_TOPIC, HALF_TOPIC, OP_HALF_TOPIC)  # one queue each, created by the front
OP_TAG = "d"  # RocketMQ's TransactionalMessageUtil.REMOVE_TAG

PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"  # the deliver time, wall ms
PROPERTY_DELAY = "DELAY"  # the delay level, when the producer gave one
# On a delivered delayed message: the deliver time it waited for, wall ms (RocketMQ's
# MessageConst.PROPERTY_TIMER_DELIVER_MS, which its proxy answers as delivery_timestamp).
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_ORIGIN_OFFSET = "ORIGIN_OFFSET"  # on a moved record: the offset of its system-topic record
PROPERTY_DECISION = "TRAN_DECISION"  # on an op record: "commit" or "rollback"
PROPERTY_HALF_OFFSET = "HALF_OFFSET"  # on an op record: the commit-log offset of its half message

# Names a producer may not set: the engine writes them, and trusts what it finds.
SYSTEM_PROPERTIES = frozenset({PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID, PROPERTY_TIMER_OUT_MS, PROPERTY_DELAY,
                               PROPERTY_TIMER_DELIVER_MS,
                               PROPERTY_TRANSACTION_PREPARED, PROPERTY_PRODUCER_GROUP, PROPERTY_ORIGIN_OFFSET,
                               PROPERTY_DECISION, PROPERTY_HALF_OFFSET})
_ROUTING = frozenset({PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID, PROPERTY_TIMER_OUT_MS})
_KEPT = ("TAGS", "KEYS", "__CRC32#")  # written again from the send's own fields


def _keep_deliver_time(waiting: Mapping[str, str], delivered: dict[str, str]) -> None:
    """A delayed message's deliver time stays on it, as ``TIMER_DELIVER_MS`` (a half message has none)."""
    if PROPERTY_TIMER_OUT_MS in waiting:
        delivered[PROPERTY_TIMER_DELIVER_MS] = waiting[PROPERTY_TIMER_OUT_MS]


def moved_message(record: Record) -> dict[str, object]:
    """A send's message map that moves ``record`` from its system topic to its real one."""
    properties = {name: value for name, value in record.properties.items()
                  if name not in _ROUTING and name not in _KEPT}
    _keep_deliver_time(record.properties, properties)
    properties[PROPERTY_ORIGIN_OFFSET] = str(record.commit_log_offset)
    message: dict[str, object] = {"body": bytes(record.body), "properties": properties, "flag": record.flag,
                                  "born_timestamp": record.born_timestamp_ms}
    if record.tags:
        message["tags"] = record.tags
    if record.keys:
        message["keys"] = record.keys
    return message


def moved_view_message(view: Mapping[str, Any]) -> dict[str, object]:
    """``moved_message`` from a record as ``CommitLogReader.read_view`` gives it (decoded in C: the
    timer's hot path)."""
    properties = {name: value for name, value in view["properties"].items() if name not in _ROUTING}
    _keep_deliver_time(view["properties"], properties)
    properties[PROPERTY_ORIGIN_OFFSET] = str(view["commit_log_offset"])
    message: dict[str, object] = {"body": view["body"], "properties": properties, "flag": view["flag"],
                                  "born_timestamp": view["born_timestamp"]}
    if view["tags"]:
        message["tags"] = view["tags"]
    if view["keys"]:
        message["keys"] = view["keys"]
    return message


def real_destination(properties: Mapping[str, str]) -> tuple[str, int] | None:
    """(REAL_TOPIC, REAL_QID) from a system-topic record's properties; None if missing or unreadable."""
    topic = properties.get(PROPERTY_REAL_TOPIC)
    queue = properties.get(PROPERTY_REAL_QID, "")
    if not topic or not queue.isascii() or not queue.isdigit():
        return None
    return topic, int(queue)


def origin_offset(record: Record) -> int | None:
    """The ``ORIGIN_OFFSET`` of a moved record, or None."""
    value = record.properties.get(PROPERTY_ORIGIN_OFFSET)
    return int(value) if value is not None and value.isascii() and value.isdigit() else None
