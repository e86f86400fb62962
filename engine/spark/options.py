"""Parsing of data source options: every bad value is refused with a message naming the option.

Spark hands options over as a case-insensitive map of strings. Each reader and
writer parses what it needs on the driver, when the data source is created,
so a typo fails the query at once instead of inside an executor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from engine.names import is_decimal

EARLIEST = -2
LATEST = -1


class OptionError(ValueError):
    """A data source option is missing, unknown or malformed; the message says which and why."""


def get_str(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    value = options.get(name)
    if value is None:
        return default
    value = str(value).strip()
    return value or default


def get_bool(options: Mapping[str, str], name: str, *, default: bool) -> bool:
    value = get_str(options, name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"option {name!r} must be true or false, not {value!r}")
    return lowered == "true"


def get_int(options: Mapping[str, str], name: str, *, default: int | None, minimum: int | None = None) -> int | None:
    value = get_str(options, name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, not {value!r}") from None
    if minimum is not None and number < minimum:
        raise OptionError(f"option {name!r} must be at least {minimum}, not {number}")
    return number


def get_choice(options: Mapping[str, str], name: str, choices: tuple[str, ...], *, default: str) -> str:
    value = (get_str(options, name) or default).lower()
    if value not in choices:
        raise OptionError(f"option {name!r} must be one of {', '.join(choices)}, not {value!r}")
    return value


def get_topics(options: Mapping[str, str], *, required: bool) -> tuple[str, ...]:
    """``topics``: comma-separated topic names, kept in the order given, without duplicates."""
    value = get_str(options, "topics")
    if value is None:
        if required:
            raise OptionError("option 'topics' is required: a comma-separated list of topic names")
        return ()
    topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
    if not topics:
        raise OptionError("option 'topics' names no topic")
    return topics


OffsetSpec = int | dict[str, dict[int, int]]


def get_offsets(options: Mapping[str, str], name: str, *, topics: tuple[str, ...], default: int) -> OffsetSpec:
    """``earliest``, ``latest`` or JSON ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest).

    Returns EARLIEST or LATEST for the words, else topic -> queue id -> offset.
    """
    value = get_str(options, name)
    if value is None:
        return default
    if value.lower() == "earliest":
        return EARLIEST
    if value.lower() == "latest":
        return LATEST
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        raise OptionError(f"option {name!r} must be earliest, latest or JSON like "
                          f'{{"orders": {{"0": 23, "1": -2}}}}, not {value!r}') from None
    if not isinstance(parsed, dict):
        raise OptionError(f"option {name!r}: the JSON must be an object of topics, not {type(parsed).__name__}")
    spec: dict[str, dict[int, int]] = {}
    for topic, queues in parsed.items():
        if topic.partition("@")[0] not in topics:  # "orders@broker-a": a cluster's set (spark/transport.py)
            raise OptionError(f"option {name!r} names topic {topic!r}, which is not in option 'topics' "
                              f"({', '.join(topics)})")
        if not isinstance(queues, dict):
            raise OptionError(f"option {name!r}: topic {topic!r} must map queue ids to offsets")
        spec[topic] = {}
        for queue, offset in queues.items():
            if not is_decimal(str(queue)) or not isinstance(offset, int) or isinstance(offset, bool) or offset < -2:
                raise OptionError(f"option {name!r}: {topic!r} queue {queue!r} -> {offset!r} is not a queue id "
                                  f"and an offset (an integer >= 0, or -2 earliest, -1 latest)")
            spec[topic][int(queue)] = offset
    return spec


SPARK_OPTIONS = frozenset({"checkpointlocation"})  # Spark's own, handed to sources and sinks as well


def check_known(options: Mapping[str, str], known: frozenset[str], source: str) -> None:
    """Refuse options this source does not know (a misspelt option would otherwise be ignored)."""
    unknown = sorted(k for k in options if k.lower() not in known | SPARK_OPTIONS)
    if unknown:
        raise OptionError(f"{source} does not know the option(s) {', '.join(unknown)}; "
                          f"it knows {', '.join(sorted(known))}")
