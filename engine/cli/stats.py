"""``stats``: engine-wide figures, or a topic's per-queue offsets and a group's lag."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from engine.cli.common import add_command, add_connection_options, connect, emit, plural
from engine.client import EngineError, StoreClient

EXAMPLES = """examples:
  %(prog)s                                     # engine-wide: log offsets, timers, open transactions
  %(prog)s --topic orders                      # per queue: offsets, counts, last store time
  %(prog)s --topic orders --group billing      # and the group's committed offsets and lag"""


def run(args: argparse.Namespace) -> int:
    if args.topic is None:
        return _engine_stats(args)
    with connect(args, timeout_ms=args.timeout_ms) as client:
        queues = {t["topic"]: t["queue_count"] for t in client.list_topics()}.get(args.topic)
        if queues is None:
            print(f"error: topic {args.topic!r} does not exist", file=sys.stderr)
            return 1
        rows = []
        pops = args.group is not None and _is_pop_group(client, args.group, args.topic)
        lag = client.consumer_lag(args.group, args.topic) if args.group and not pops else {}
        for queue_id in range(queues):
            row = {"queue_id": queue_id, **{k: v for k, v in client.queue_stats(args.topic, queue_id).items()
                                            if k not in ("v", "id", "ok")}}
            if pops:
                pop = client.pop_stats(args.group, args.topic, queue_id)
                row.update({k: pop[k] for k in ("ack_floor", "in_flight", "redelivered", "dead_lettered")})
            elif args.group:
                row["committed_offset"] = client.fetch_offset(args.group, args.topic, queue_id)
                row["lag"] = lag[queue_id]
            rows.append(row)
    lines = [f"{args.topic}/{r['queue_id']}: offsets {r['min_offset']}..{r['max_offset']} "
             f"({plural(r['message_count'], 'message')}), last stored {r['latest_store_timestamp']}"
             + _group_text(args, r) for r in rows]
    emit(args, rows, "\n".join(lines))
    return 0


def _engine_stats(args: argparse.Namespace) -> int:
    """Engine-wide figures: the log's offsets, topics, and the messages waiting in the timer and
    for a transaction decision."""
    with connect(args, timeout_ms=args.timeout_ms) as client:
        status = client.status()
        topics = len(client.list_topics())  # as `topics` lists them: without the system topics
    offsets = status["offsets"]
    system = status["topics"] - topics
    summary = {"topics": topics, "system_topics": system, "flush_mode": status["flush_mode"], **offsets}
    text = (f"{plural(topics, 'topic')} (+{system} system), "
            f"log {offsets['min_offset']}..{offsets['confirmed_offset']} "
            f"(flushed to {offsets['flushed_offset']}, {status['flush_mode']})\n"
            f"timers pending: {offsets['timers_pending']}; half messages without a decision: "
            f"{offsets['halves_pending']}")
    emit(args, summary, text)
    return 0


def _is_pop_group(client: StoreClient, group: str, topic: str) -> bool:
    """A group pops a topic unless it commits offsets on it (the engine refuses pop_stats then)."""
    try:
        pop_cursor: int = client.pop_stats(group, topic, 0)["pop_cursor"]
        return pop_cursor >= 0
    except EngineError as exc:
        if exc.name == "GROUP_MODE_CONFLICT":
            return False
        raise


def _group_text(args: argparse.Namespace, row: dict[str, Any]) -> str:
    if "ack_floor" in row:
        return (f", {args.group}: acked below {row['ack_floor']}, in flight {row['in_flight']}, "
                f"redelivered {row['redelivered']}, dead-lettered {row['dead_lettered']}")
    if "lag" in row:
        return f", {args.group} at {row['committed_offset']}, lag {row['lag']}"
    return ""


def add(commands: Any) -> None:
    stats = add_command(commands, "stats", "per-queue offsets, counts, store times, and a group's lag", EXAMPLES)
    add_connection_options(stats)
    stats.add_argument("--topic", help="per-queue figures of this topic (default: engine-wide figures, with the "
                                       "timers and half messages pending)")
    stats.add_argument("--group", help="also show this consumer group's committed offsets and lag, or, for a "
                                       "pop group, its ack floor, in-flight, redelivered and dead-lettered counts")
    stats.set_defaults(handler=run)
