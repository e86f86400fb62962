"""The row filter a file reader applies while decoding, built from options and pushed-down filters.

Spark hands over the conjuncts of a query's WHERE clause it can push down
(``spark.sql.python.filterPushdown.enabled=true``); those on ``topic``,
``queue_id`` and ``store_timestamp`` narrow what is planned and decoded.
Every filter is still handed back to Spark, which evaluates it again on the
rows: a filter here may only ever keep too much, never drop a matching row.

Store timestamps are whole milliseconds and Spark timestamps microseconds, so
bounds are rounded outwards: ``store_timestamp > t`` keeps milliseconds
above ``floor(t)``, ``store_timestamp < t`` those below ``ceil(t)``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from pyspark.sql.datasource import EqualTo, Filter, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual

from engine.layout import Record

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)

T = TypeVar("T")


@dataclass(frozen=True)
class RecordFilter:
    """Which records a reader keeps; None means no restriction on that field."""

    topics: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    start_ms: int | None = None  # store_timestamp >= start_ms
    end_ms: int | None = None  # store_timestamp < end_ms

    def matches(self, record: Record) -> bool:
        return ((self.topics is None or record.topic in self.topics)
                and (self.queue_ids is None or record.queue_id in self.queue_ids)
                and (self.start_ms is None or record.store_timestamp_ms >= self.start_ms)
                and (self.end_ms is None or record.store_timestamp_ms < self.end_ms))

    @property
    def empty(self) -> bool:
        """True when no record can match (contradicting conditions)."""
        return (self.topics is not None and not self.topics) or (self.queue_ids is not None and not self.queue_ids) \
            or (self.start_ms is not None and self.end_ms is not None and self.start_ms >= self.end_ms)

    def narrowed(self, *, topics: frozenset[str] | None = None, queue_ids: frozenset[int] | None = None,
                 start_ms: int | None = None, end_ms: int | None = None) -> RecordFilter:
        """This filter AND the given conditions."""
        return replace(
            self,
            topics=_intersect(self.topics, topics),
            queue_ids=_intersect(self.queue_ids, queue_ids),
            start_ms=_pick(max, self.start_ms, start_ms),
            end_ms=_pick(min, self.end_ms, end_ms))

    def with_pushed(self, pushed: Filter) -> RecordFilter | None:
        """This filter narrowed by one pushed-down filter; None if it is not one we use."""
        attribute: tuple[str, ...] = getattr(pushed, "attribute", ())  # Not (and other combinators) carry none
        column = attribute[0] if len(attribute) == 1 else None
        if column == "topic":
            values = _values(pushed)
            if values is not None:
                topics = [v for v in values if isinstance(v, str)]
                if len(topics) == len(values):
                    return self.narrowed(topics=frozenset(topics))
        elif column == "queue_id":
            values = _values(pushed)
            if values is not None:
                queue_ids = [v for v in values if isinstance(v, int)]
                if len(queue_ids) == len(values):
                    return self.narrowed(queue_ids=frozenset(queue_ids))
        elif column == "store_timestamp":
            value = getattr(pushed, "value", None)
            # Spark hands over aware datetimes; a naive one has an unknown zone and is left to Spark.
            if isinstance(value, dt.datetime) and value.tzinfo is not None:
                return self._with_time(pushed)
        return None

    def _with_time(self, pushed: Filter) -> RecordFilter | None:
        us = _micros(pushed.value)  # type: ignore[attr-defined]
        floor_ms, ceil_ms = us // 1000, -(-us // 1000)
        if isinstance(pushed, GreaterThan):
            return self.narrowed(start_ms=floor_ms + 1)
        if isinstance(pushed, GreaterThanOrEqual):
            return self.narrowed(start_ms=ceil_ms)
        if isinstance(pushed, LessThan):
            return self.narrowed(end_ms=ceil_ms)
        if isinstance(pushed, LessThanOrEqual):
            return self.narrowed(end_ms=floor_ms + 1)
        if isinstance(pushed, EqualTo):
            return self.narrowed(start_ms=ceil_ms, end_ms=floor_ms + 1)
        return None


def _values(pushed: Filter) -> list[object] | None:
    if isinstance(pushed, EqualTo):
        return [pushed.value]
    if isinstance(pushed, In):
        return list(pushed.value)
    return None


def _micros(value: dt.datetime) -> int:
    return (value - _EPOCH) // _US


def _intersect(a: frozenset[T] | None, b: frozenset[T] | None) -> frozenset[T] | None:
    if a is None:
        return b
    return a if b is None else a & b


def _pick(choose: Callable[[int, int], int], a: int | None, b: int | None) -> int | None:  # choose: max or min
    if a is None:
        return b
    return a if b is None else choose(a, b)
