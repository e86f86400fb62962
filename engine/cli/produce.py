"""``produce``: send messages to one engine, or with ``--cluster`` over a cluster's queues."""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from typing import TYPE_CHECKING, Any

from engine.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    add_cluster_options,
    add_command,
    add_connection_options,
    connect,
    curve_keys,
    emit,
    engine_endpoint,
    epoch_ms,
    non_negative,
    plural,
    positive,
    queue_number,
)
from engine.client import ClientError, EngineUnreachable, StoreClient, engine_answers
from engine.layout import PROPERTY_UNIQ_KEY as UNIQ_KEY
from engine.progress import count_bar
from engine.store.system_topics import PROPERTY_REAL_QID, PROPERTY_TIMER_OUT_MS
from rmqpy.raw import SetClient, UniqKeys

if TYPE_CHECKING:
    from engine.cli.cluster import SpreadSends

PRODUCE_BAR_COUNT_MIN = 1_000  # produce draws a progress bar (on a terminal) from this many messages on

EXAMPLES = """examples:
  %(prog)s --topic orders --body "hello"
  %(prog)s --topic orders --count 10000 --batch-size 100 --keys --tags TagA   # a bar on a terminal
  %(prog)s --topic orders --body "reminder" --delay-ms 30000   # delivered in 30 s"""


def run(args: argparse.Namespace) -> int:
    body = args.body.encode() if args.body is not None else b"x" * args.body_size
    bar = count_bar(args.count, desc="produce", unit=" msg",
                    enabled=False if args.json or args.count < PRODUCE_BAR_COUNT_MIN else None)
    # The results shown name each message by its uniq key, the id consumers get (the same across a
    # delay or a transaction): made here, as rmqpy's producer does. Unshown, the engine makes them.
    shown = args.json or args.count <= 20
    failing_over = args.cluster is not None or "," in engine_endpoint(args)  # a set's address, or a cluster
    keyed = shown or failing_over  # a send again after a failover carries the same ids: a copy can be told
    uniq_keys = UniqKeys()
    sent = 0
    results: list[dict[str, Any]] = []
    interrupted = False
    started = time.perf_counter()
    with _send_targets(args) as targets, bar:
        existed = targets.client is None or _exists_where_sent(targets.client, args.topic)
        try:
            while sent < args.count:
                n = min(args.batch_size, args.count - sent)
                batch = []
                for i in range(sent, sent + n):
                    message: dict[str, Any] = {"body": body}
                    if keyed:
                        message["properties"] = {UNIQ_KEY: uniq_keys.next()}
                    if args.keys:
                        message["keys"] = [f"{args.key_prefix}{i}"]
                    if args.tags:
                        message["tags"] = args.tags
                    batch.append(message)
                client, batch_results, broker = targets.send(
                    args.topic, batch, delay_ms=args.delay_ms, deliver_at_ms=args.deliver_at,
                    delay_level=args.delay_level, transaction=args.transaction,
                    producer_group=args.producer_group if args.transaction else None)
                if not existed:
                    _say_created(client, args.topic)
                    existed = True
                if shown:
                    results.extend({**_delivery(client, args, result, m["properties"][UNIQ_KEY]),
                                    **({"broker_name": broker} if broker else {})}
                                   for result, m in zip(batch_results, batch, strict=True))
                sent += n
                bar.update(n)
        except KeyboardInterrupt:  # what was acknowledged so far is stored: say how much
            interrupted = True
        elapsed = time.perf_counter() - started
    rate = sent / elapsed if elapsed > 0 else float("inf")
    summary = {"sent": sent, "seconds": round(elapsed, 3), "messages_per_second": round(rate),
               "megabytes_per_second": round(rate * len(body) / 1e6, 2), "results": results}
    if interrupted:
        summary["interrupted"] = True
    lines = [_result_line(r) for r in results]
    if args.transaction:
        lines.append("half messages: commit or roll back each with `transaction --commit ID` / `--rollback ID`")
    elif not results and (args.delay_ms is not None or args.deliver_at is not None or args.delay_level is not None):
        lines.append("delayed: each reaches its queue at its deliver time")
    lines.append(f"{'interrupted: ' if interrupted else ''}sent {plural(sent, 'message')} in {elapsed:.3f} s: "
                 f"{rate:,.0f} msg/s, {summary['megabytes_per_second']} MB/s")
    emit(args, summary, "\n".join(lines))
    return EXIT_INTERRUPTED if interrupted else EXIT_OK


class OneEngine:
    """Where each batch of ``produce`` goes without ``--cluster``: (its engine, --queue-id, no broker)."""

    def __init__(self, client: StoreClient, queue_id: int | None, sharding_key: str | None) -> None:
        self.client = client
        self.queue_id = queue_id
        self.sharding_key = sharding_key

    def __enter__(self) -> OneEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def send(self, topic: str, batch: list[dict[str, Any]], **fields: Any) -> tuple[StoreClient, list[Any], None]:
        """The batch sent: (the client, its results, no broker set named)."""
        return self.client, self.client.send(topic, batch, queue_id=self.queue_id, sharding_key=self.sharding_key,
                                             **fields), None


def _send_targets(args: argparse.Namespace) -> OneEngine | SpreadSends:
    """Where ``produce`` sends: one engine, or with ``--cluster`` each batch to a queue of the route."""
    if args.cluster is None and "," in engine_endpoint(args):  # a broker set: its master, across a failover
        address = engine_endpoint(args)
        if not any(engine_answers(member.strip()) for member in address.split(",") if member.strip()):
            raise EngineUnreachable(address)
        return OneEngine(SetClient(address, timeout_ms=args.timeout_ms, curve=curve_keys(args)), args.queue_id,
                         args.sharding_key)
    if args.cluster is None:
        return OneEngine(connect(args, timeout_ms=args.timeout_ms), args.queue_id, args.sharding_key)
    from engine.cli.cluster import SpreadSends, cluster_route  # etcd's client only when asked for

    return SpreadSends(args, cluster_route(args, masters_required=args.sharding_key is not None), curve_keys(args))


def _exists_where_sent(client: StoreClient, topic: str) -> bool:
    """Whether ``topic`` exists at the engine that will take the sends: a replica refuses them and
    its client follows to the master (``NOT_MASTER``), and a replica's topic table is its master's
    of up to ``replication_config_interval_ms`` ago (shipped, docs/replication.md): a topic just
    created there is not in it yet. So a replica's master is asked. Unknown (the master does not
    answer): True, so that no creation is claimed."""
    route = client.route()
    master = route.get("master_endpoint")
    if route.get("role") != "replica" or not isinstance(master, str) or not master or master == client.endpoint:
        return topic in {t["topic"] for t in client.list_topics()}
    try:
        with StoreClient(master, timeout_ms=client.timeout_ms, curve=client.curve, direct_replies=False) as at_master:
            return topic in {t["topic"] for t in at_master.list_topics()}
    except ClientError:
        return True


def _say_created(client: StoreClient, topic: str) -> None:
    """A send to an unknown topic created it (``auto_create_topic``): tell the user, who may have
    mistyped the name."""
    queues = {t["topic"]: t["queue_count"] for t in client.list_topics()}.get(topic)
    if queues is not None:
        print(f"created topic {topic} with {plural(queues, 'queue')} (auto-create)", file=sys.stderr)


def _delivery(client: StoreClient, args: argparse.Namespace, result: dict[str, Any],
              uniq_key: str) -> dict[str, Any]:
    """A send result as the user will see the message delivered: its real topic and queue, its
    ``uniq_key`` (the id a consumer gets, the same after a delay or a commit) and, for a delayed
    one, when it is due. ``msg_id`` stays the stored record's (the one ``transaction --commit``
    takes); for a delayed or half message that record waits in a system topic (``waiting_in``)."""
    shown = {**result, "topic": args.topic, "uniq_key": uniq_key}
    delayed = args.delay_ms is not None or args.deliver_at is not None or args.delay_level is not None
    if not (delayed or args.transaction) or result.get("queue_offset", -1) < 0:
        return shown
    record = client.get_by_id(result["msg_id"])
    properties = record["properties"]
    shown["waiting_in"] = f"{record['topic']}/{record['queue_id']}@{record['queue_offset']}"
    shown["queue_id"] = int(properties.get(PROPERTY_REAL_QID, -1))
    shown["queue_offset"] = -1  # known when it is delivered
    if delayed and PROPERTY_TIMER_OUT_MS in properties:
        shown["deliver_at_ms"] = int(properties[PROPERTY_TIMER_OUT_MS])
    if args.transaction:
        shown["visible"] = "when committed"
    return shown


def _result_line(r: dict[str, Any]) -> str:
    where = (f"{r['broker_name']}:" if "broker_name" in r else "") + f"{r['topic']}/{r['queue_id']}"
    where += f"@{r['queue_offset']}" if r["queue_offset"] >= 0 else ""
    line = f"{r['status']} {where} uniq_key={r['uniq_key']}"
    if "deliver_at_ms" in r:
        due = datetime.datetime.fromtimestamp(r["deliver_at_ms"] / 1000, tz=datetime.UTC)
        line += (f" due {due.isoformat(timespec='milliseconds').replace('+00:00', 'Z')} "
                 f"(in {max(0.0, r['deliver_at_ms'] / 1000 - time.time()):.1f} s)")
    if "visible" in r:
        line += f" invisible until committed: `transaction --commit {r['msg_id']}`"
    if "waiting_in" in r:
        return f"{line}; waiting as {r['waiting_in']} id={r['msg_id']}"
    return f"{line} id={r['msg_id']}"


def add(commands: Any) -> None:
    produce = add_command(commands, "produce", "send messages", EXAMPLES)
    add_connection_options(produce)
    produce.add_argument("--topic", required=True, help="the topic to send to (created on first use unless the "
                                                        "engine has auto_create_topic = false)")
    produce.add_argument("--count", type=positive, default=1, metavar="N",
                         help=f"how many messages (default 1; from {PRODUCE_BAR_COUNT_MIN:,} on, a progress bar "
                              f"on a terminal)")
    produce.add_argument("--body", help="the body text (default: --body-size bytes of 'x')")
    produce.add_argument("--body-size", type=positive, default=256, metavar="BYTES",
                         help="the size of the generated body when --body is not given (default 256)")
    produce.add_argument("--batch-size", type=positive, default=1, metavar="N",
                         help="messages per send request (default 1)")
    produce.add_argument("--queue-id", type=queue_number, metavar="Q",
                         help="send to this queue (default: the engine picks)")
    produce.add_argument("--sharding-key", metavar="KEY",
                         help="messages with one key go to one queue (per-key order)")
    produce.add_argument("--keys", action="store_true", help="give message i the key <key-prefix><i>")
    produce.add_argument("--key-prefix", default="key-", metavar="TEXT", help="with --keys (default key-)")
    produce.add_argument("--tags", metavar="TAG", help="the tag of every message (consumers filter on it)")
    timing = produce.add_mutually_exclusive_group()
    timing.add_argument("--delay-ms", type=non_negative, metavar="MS",
                        help="deliver this many ms from now (a delayed message)")
    timing.add_argument("--deliver-at", type=epoch_ms, metavar="TIME",
                        help="deliver at this time: epoch ms, or ISO 8601 such as 2026-11-25T10:00:00Z")
    timing.add_argument("--delay-level", type=positive, metavar="LEVEL",
                        help="RocketMQ 4's delay level: 1 = 1 s ... 18 = 2 h")
    timing.add_argument("--transaction", action="store_true",
                        help="store half messages, invisible until `transaction --commit` (see --producer-group)")
    produce.add_argument("--producer-group", default="cli-producers", metavar="GROUP",
                         help="with --transaction: the group whose producers answer the checks (default cli-producers)")
    add_cluster_options(produce)
    produce.set_defaults(handler=run)
