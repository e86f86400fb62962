"""Offsets of the ``rmq`` source: resolving start and end, splitting a trigger's budget, JSON form.

An offset map gives, per (topic, queue id), the next queue offset to read
(the end is exclusive), as Kafka's source does. In Spark's checkpoint it is
JSON ``{"orders": {"0": 42, "1": 17}}``; a queue missing from a start map
(a queue added to a topic after the query started) starts at 0.

Start and end come from options: ``earliest`` (the queue's min offset),
``latest`` (its max offset), JSON with per-queue offsets (-2 earliest,
-1 latest; queues not listed take the default), or, for the start only,
``startingTimestamp``: per queue, the first message stored at or after it.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.spark.options import EARLIEST, LATEST, OffsetSpec, OptionError

QueueKey = tuple[str, int]
Offsets = dict[QueueKey, int]
Bounds = dict[QueueKey, tuple[int, int]]
OffsetsJson = dict[str, dict[str, int]]  # topic -> queue id as a string -> offset: Spark's checkpointed form


def to_json(offsets: Offsets) -> OffsetsJson:
    result: OffsetsJson = {}
    for (topic, queue_id), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(queue_id)] = offset
    return result


def from_json(data: OffsetsJson) -> Offsets:
    return {(topic, int(queue)): int(offset) for topic, queues in data.items() for queue, offset in queues.items()}


def resolve(spec: OffsetSpec, bounds: Bounds, *, default: int) -> Offsets:
    """Offsets for every queue in ``bounds`` (queue -> (min, max)) from a parsed option."""
    resolved: Offsets = {}
    for key, (low, high) in bounds.items():
        wanted = spec.get(key[0], {}).get(key[1], default) if isinstance(spec, dict) else spec
        resolved[key] = low if wanted == EARLIEST else high if wanted == LATEST else wanted
    return resolved


def resolve_by_time(bounds: Bounds, timestamp_ms: int, offset_for_time: Callable[[str, int, int], int]) -> Offsets:
    """Per queue, the first offset stored at or after ``timestamp_ms`` (its max if none is)."""
    resolved: Offsets = {}
    for (topic, queue_id), (low, high) in bounds.items():
        found = offset_for_time(topic, queue_id, timestamp_ms) if high > low else high
        resolved[(topic, queue_id)] = min(max(found, low), high)
    return resolved


def check_range(start: Offsets, end: Offsets, bounds: Bounds, *, fail_on_data_loss: bool) -> Offsets:
    """Validate a batch read's [start, end) per queue; returns the start, moved up past lost offsets
    when ``fail_on_data_loss`` is false. OptionError names the first offending queue."""
    checked: Offsets = {}
    for key, (low, high) in bounds.items():
        where = f"{key[0]}/{key[1]}"
        s, e = start[key], end[key]
        if e > high:
            raise OptionError(f"endingOffsets: {where} ends at {high}; {e} is past its end")
        if s > e:
            raise OptionError(f"{where}: the starting offset {s} is after the ending offset {e}")
        if s < low:
            if fail_on_data_loss:
                raise OptionError(f"startingOffsets: {where} starts at {low} (older messages were removed); {s} "
                                  f"is gone. Set failOnDataLoss=false to start at {low}")
            s = min(low, e)
        checked[key] = s
    return checked


def rate_limit(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """End offsets taking at most ``max_rows`` in total, shared in proportion to each queue's backlog.

    Shares are rounded down, and the rows left over go one by one to the queues with the
    largest remainders (ties by topic and queue): the total is exactly min(max_rows, backlog).
    """
    assert max_rows > 0
    backlog = {key: max(0, latest[key] - start.get(key, 0)) for key in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    shares = {key: max_rows * size // total for key, size in backlog.items()}
    left = max_rows - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda k: (-(max_rows * backlog[k] % total), k))
    for key in by_remainder[:left]:
        shares[key] += 1
    limited = {key: start.get(key, 0) + shares[key] for key in latest}
    assert sum(shares.values()) == max_rows
    assert all(start.get(key, 0) <= limited[key] <= latest[key] for key in latest)
    return limited
