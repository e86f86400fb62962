"""Where the writer stores a send: its own topic and queue, or a system topic that holds it
until its time (a delayed or timed send) or its producer's decision (a transactional send).

RocketMQ makes this rewrite in the broker before the put (``HookUtils``,
``TransactionalMessageBridge#parseHalfMessageInner``); here the writer makes it, once the
front has chosen the real queue (given, by sharding key, or round robin), so that the
queue a delayed message reaches is the one it would have reached at once.
"""

from __future__ import annotations

import msgspec

from engine.config import StoreConfig
from engine.errors import ErrorCode, RequestError
from engine.ipc.protocol import SendMessage, SendRequest
from engine.names import validate_group
from engine.store.system_topics import (
    HALF_TOPIC,
    PROPERTY_DELAY,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TRANSACTION_PREPARED,
    SYSTEM_PROPERTIES,
    TIMER_TOPIC,
)


def redirect(messages: list[SendMessage], extra: dict[str, str]) -> list[SendMessage]:
    """The batch with the routing properties ``extra`` added to every message."""
    return [msgspec.structs.replace(message, properties={**message.properties, **extra}) for message in messages]


def destination(request: SendRequest, queue_id: int, *, config: StoreConfig, now_ms: int,
                internal: bool) -> tuple[str, int, list[SendMessage]]:
    """(topic, queue id, messages) to append; RequestError if the routing fields are refused."""
    messages = request.messages
    if not messages:
        raise RequestError(ErrorCode.INVALID_FIELD, "a send needs 'messages' (at least one) or 'records'")
    if request.committed_half is not None and not internal:
        raise RequestError(ErrorCode.INVALID_FIELD, "committed_half is set by the engine only")
    if not internal:
        for message in messages:
            if message.properties and not SYSTEM_PROPERTIES.isdisjoint(message.properties):
                names = ", ".join(sorted(SYSTEM_PROPERTIES.intersection(message.properties)))
                raise RequestError(ErrorCode.INVALID_PROPERTY, f"the properties {names} are set by the engine only")
    deliver_ms = deliver_time(request, config=config, now_ms=now_ms)
    real = {PROPERTY_REAL_TOPIC: request.topic, PROPERTY_REAL_QID: str(queue_id)}
    if request.transaction:
        if deliver_ms is not None:
            raise RequestError(ErrorCode.INVALID_FIELD, "a transactional send cannot be delayed")
        if request.producer_group is None:
            raise RequestError(ErrorCode.INVALID_FIELD, "a transactional send needs 'producer_group' (the group "
                                                        "whose producers answer the transaction checks)")
        validate_group(request.producer_group)
        return HALF_TOPIC, 0, redirect(messages, {**real, PROPERTY_TRANSACTION_PREPARED: "true",
                                                  PROPERTY_PRODUCER_GROUP: request.producer_group})
    if deliver_ms is None or deliver_ms <= now_ms:
        return request.topic, queue_id, messages  # a deliver time already past: stored for consumers now
    timing = {**real, PROPERTY_TIMER_OUT_MS: str(deliver_ms)}
    if request.delay_level is not None:
        timing[PROPERTY_DELAY] = str(min(request.delay_level, len(config.delay_levels_ms)))
    return TIMER_TOPIC, 0, redirect(messages, timing)


def check_plain_records(request: SendRequest) -> None:
    """A batch the client encoded (``records``) is stored in its own topic and queue as it is:
    RequestError if the request also asks for a delay, a transaction or messages."""
    routing = [name for name in ("delay_level", "delay_ms", "deliver_at_ms", "committed_half")
               if getattr(request, name) is not None]
    if request.transaction:
        routing.append("transaction")
    if request.messages:
        routing.append("messages")
    if routing:
        raise RequestError(ErrorCode.INVALID_FIELD, f"a batch of records is a plain send: send messages, not "
                                                    f"records, with {', '.join(routing)}")


def deliver_time(request: SendRequest, *, config: StoreConfig, now_ms: int) -> int | None:
    """The wall-clock ms the batch is due, or None if it is not delayed."""
    given = [name for name in ("delay_level", "delay_ms", "deliver_at_ms") if getattr(request, name) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise RequestError(ErrorCode.INVALID_FIELD, f"give one of delay_level, delay_ms and deliver_at_ms, "
                                                    f"not {' and '.join(given)}")
    if request.delay_level is not None:  # RocketMQ caps a level past the last at the last
        deliver_ms = now_ms + config.delay_levels_ms[min(request.delay_level, len(config.delay_levels_ms)) - 1]
    elif request.delay_ms is not None:
        deliver_ms = now_ms + request.delay_ms
    else:
        assert request.deliver_at_ms is not None
        deliver_ms = request.deliver_at_ms
    if deliver_ms - now_ms > config.timer_max_delay_ms:
        raise RequestError(ErrorCode.DELAY_ILLEGAL, f"the deliver time is {deliver_ms - now_ms} ms away; the limit "
                                                    f"is timer_max_delay_ms = {config.timer_max_delay_ms}")
    return deliver_ms
