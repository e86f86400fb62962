"""What the dashboard's page reads, as JSON: the monitor's view (``engine/metrics/collector.py``)
arranged by topic and by group, the recent rates, and messages looked up through the front.

Every answer is built from what the engine already tells Prometheus, so the page and a
scrape never disagree. Searches are requests of the client protocol on the front's
internal port, the one the timer and the transaction actor use: only reads are made.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

from engine.client import EngineError, StoreClient
from engine.metrics.collector import View

BODY_PREVIEW_BYTES = 512
SEARCH_RESULTS_MAX = 32
PER_QUEUE_BY_TIME = 8


def overview(view: View, config_flush_mode: str, topic_count: int) -> dict[str, Any]:
    status = view.supervisor
    actors = [] if status is None else [
        {"name": a.name, "pid": a.pid, "state": a.lifecycle, "restarts": a.restarts,
         "rss_bytes": a.detail.get("rss_bytes", 0), "open_files": a.detail.get("open_files", 0)}
        for a in status.actors]
    one = {family: rows[0][-1] for family, rows in view.samples.items() if len(rows) == 1 and len(rows[0]) == 1}
    return {
        "state": status.state if status is not None else "UNKNOWN",
        "reasons": status.reasons if status is not None else ["no status from the supervisor"],
        "flush_mode": config_flush_mode,
        "actors": actors,
        "offsets": dict(view.rows("rmqpy_log_offset_bytes")),
        "behind": dict(view.rows("rmqpy_log_behind_bytes")),
        "disk_used_ratio": one.get("rmqpy_disk_used_ratio", 0.0),
        "disk_free_bytes": one.get("rmqpy_disk_free_bytes", 0),
        "disk_full": bool(one.get("rmqpy_disk_full", 0)),
        "timers_pending": one.get("rmqpy_timers_pending_messages", 0),
        "halves_pending": one.get("rmqpy_transaction_halves_pending_messages", 0),
        "topics": topic_count,
    }


def _by_queue(view: View, family: str) -> dict[tuple[str, int], Any]:
    return {(row[0], int(row[1])): row[2] for row in view.rows(family)}


def topics(view: View, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each topic the front lists, with its queues' offsets and the messages sent and pulled."""
    columns = {"min_offset": "rmqpy_queue_min_offset", "max_offset": "rmqpy_queue_max_offset",
               "sent_messages": "rmqpy_queue_sent_messages", "sent_bytes": "rmqpy_queue_sent_bytes",
               "pulled_messages": "rmqpy_queue_pulled_messages", "pulled_bytes": "rmqpy_queue_pulled_bytes"}
    figures = {name: _by_queue(view, family) for name, family in columns.items()}
    result = []
    for topic in listed:
        queues = [{"queue_id": q, **{name: values.get((topic["topic"], q), 0) for name, values in figures.items()}}
                  for q in range(topic["queue_count"])]
        result.append({"topic": topic["topic"], "queue_count": topic["queue_count"], "queues": queues,
                       "messages": sum(q["max_offset"] - q["min_offset"] for q in queues)})
    return result


def groups(view: View) -> list[dict[str, Any]]:
    """Consumer groups (committed offsets and lag) and pop groups (in flight, due, redelivered)."""
    max_offsets = _by_queue(view, "rmqpy_queue_max_offset")
    found: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for group, topic, queue_id, committed in view.rows("rmqpy_group_committed_offset"):
        end = max_offsets.get((topic, int(queue_id)), 0)
        found.setdefault((group, topic, "offsets"), []).append(
            {"queue_id": int(queue_id), "committed_offset": committed, "max_offset": end,
             "lag": max(0, end - committed) if committed >= 0 else end})
    pops = {name: {(g, t, int(q)): v for g, t, q, v in view.rows(f"rmqpy_pop_{name}")}
            for name in ("in_flight_messages", "due_messages", "redelivered_messages", "dead_lettered_messages")}
    for (group, topic, queue_id), in_flight in pops["in_flight_messages"].items():
        key = (group, topic, queue_id)
        found.setdefault((group, topic, "pop"), []).append(
            {"queue_id": queue_id, "in_flight": in_flight, "due": pops["due_messages"].get(key, 0),
             "redelivered": pops["redelivered_messages"].get(key, 0),
             "dead_lettered": pops["dead_lettered_messages"].get(key, 0),
             "max_offset": max_offsets.get((topic, queue_id), 0)})
    result = []
    for (group, topic, mode), queues in sorted(found.items()):
        queues.sort(key=lambda q: q["queue_id"])
        total = sum(q["lag"] for q in queues) if mode == "offsets" else sum(q["in_flight"] for q in queues)
        result.append({"group": group, "topic": topic, "mode": mode, "queues": queues,
                       "lag" if mode == "offsets" else "in_flight": total})
    return result


class Rates:
    """Messages sent and pulled a second over the last minutes, from one sample a second. A rate's
    time is the wall clock's (for the chart), its interval the monotonic clock's: a wall clock set
    back or ahead neither spikes nor hides a rate."""

    def __init__(self, seconds_kept: int) -> None:
        # (wall ms, monotonic ms, sent, pulled)
        self.samples: deque[tuple[int, int, int, int]] = deque(maxlen=seconds_kept + 1)

    def sample(self, sent_and_pulled: tuple[int, int], wall_ms: int, mono_ms: int) -> None:
        self.samples.append((wall_ms, mono_ms, *sent_and_pulled))

    def series(self) -> list[dict[str, float]]:
        points = list(self.samples)
        series = []
        for (_, m0, sent0, pulled0), (t1, m1, sent1, pulled1) in itertools.pairwise(points):
            seconds = max(1, m1 - m0) / 1000
            # a counter that went down belongs to a restarted actor: count what it has done since
            series.append({"t": t1, "sent": (sent1 - sent0 if sent1 >= sent0 else sent1) / seconds,
                           "pulled": (pulled1 - pulled0 if pulled1 >= pulled0 else pulled1) / seconds})
        return series


def rates_answer(rates: Rates) -> dict[str, Any]:
    return {"interval_s": 1, "series": rates.series()}


def shown(message: dict[str, Any]) -> dict[str, Any]:
    """A message for the page: every field, the body as a preview (text if it decodes, else hex)."""
    body: bytes = message.get("body", b"")
    head = body[:BODY_PREVIEW_BYTES]
    try:
        preview, encoding = head.decode("utf-8"), "text"
    except UnicodeDecodeError:
        preview, encoding = head.hex(" "), "hex"
    return {**{k: v for k, v in message.items() if k != "body"}, "body_bytes": len(body),
            "body_preview": preview, "body_encoding": encoding, "body_truncated": len(body) > len(head)}


def search(client: StoreClient, *, topic: str = "", key: str = "", msg_id: str = "",
           time_ms: int | None = None, queue_count: int = 0) -> list[dict[str, Any]]:
    """Messages by key (with a topic), by message id, or stored from a time on (with a topic)."""
    if msg_id:
        return [shown(client.get_by_id(msg_id))]
    if key:
        return [shown(m) for m in client.query_by_key(topic, key, max_results=SEARCH_RESULTS_MAX)]
    if time_ms is not None:
        found: list[dict[str, Any]] = []
        for queue_id in range(queue_count):
            try:
                offset = client.offset_for_time(topic, queue_id, time_ms)
            except EngineError:
                continue
            found.extend(client.pull(topic, queue_id, offset, max_messages=PER_QUEUE_BY_TIME)["messages"])
        found.sort(key=lambda m: (m["store_timestamp"], m["commit_log_offset"]))
        return [shown(m) for m in found[:SEARCH_RESULTS_MAX]]
    return []
