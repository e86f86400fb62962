# PYTHON_ARGCOMPLETE_OK (argcomplete's global completion looks for this line)
"""``rmqpy`` and ``python -m engine``: produce, consume, query and inspect from the command line.

    python -m engine produce --topic T --count 10000 --body-size 256 --batch-size 100 --keys --tags TagA
    python -m engine consume --topic T [--queue-id 0] [--offset 0] [--count 100]
                             [--group G] [--subscription "tagA || tagB"] [--wait-ms 5000] [--since-ms T]
    python -m engine query --topic T --key K        |  python -m engine query --id MSGID
    python -m engine topics [--create T --queues 8 | --delete T]
    python -m engine stats --topic T [--group G]    (per-queue offsets, store times, a group's lag)
    python -m engine inspect --store-dir DIR         (offline: segments, records, queues, index, checkpoint)
    python -m engine check --store-dir DIR           (offline: verify every structure against the log)
    python -m engine keygen --dir keys --name server (a CURVE key pair; --server-key/--client-key use them)

Online commands reach the engine at ``--endpoint``, or at the endpoint of the
engine running on ``--store-dir``. ``--json`` prints machine-readable output.
Every command's ``--help`` shows examples; ``rmqpy`` (pyproject.toml's console
script) is the same program, with shell completion through argcomplete.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import argcomplete

from engine.client import DEFAULT_ENDPOINT, ClientError, EngineError, StoreClient
from engine.ipc.curve import CurveKeys, keygen
from engine.ipc.endpoints import NotRunning, read_engine_state
from engine.progress import StageBars, count_bar
from engine.version import package_version

PRODUCE_BAR_COUNT_MIN = 1_000  # produce draws a progress bar (on a terminal) from this many messages on


def _endpoint(args: argparse.Namespace) -> str:
    if args.endpoint:
        return args.endpoint
    if args.store_dir:
        return str(read_engine_state(args.store_dir)["endpoint"])
    return DEFAULT_ENDPOINT


def _client(args: argparse.Namespace, *, timeout_ms: int) -> StoreClient:
    curve = None
    if args.server_key or args.client_key:
        if not (args.server_key and args.client_key):
            raise SystemExit("error: CURVE needs both --server-key and --client-key")
        curve = CurveKeys.from_files(args.server_key, args.client_key)
    return StoreClient(_endpoint(args), timeout_ms=timeout_ms, curve=curve)


def _printable(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(_printable(data), indent=2) if args.json else text)


def _message_line(m: dict[str, Any]) -> str:
    body = _printable(m["body"])
    shown = body if len(body) <= 60 else body[:57] + "..."
    return (f"{m['topic']}/{m['queue_id']}@{m['queue_offset']} id={m['msg_id']} tags={m['tags']} "
            f"keys={','.join(m['keys'])} body={shown!r}")


def cmd_produce(args: argparse.Namespace) -> int:
    body = args.body.encode() if args.body is not None else b"x" * args.body_size
    bar = count_bar(args.count, desc="produce", unit=" msg",
                    enabled=False if args.json or args.count < PRODUCE_BAR_COUNT_MIN else None)
    with _client(args, timeout_ms=args.timeout_ms) as client, bar:
        sent = 0
        results: list[dict[str, Any]] = []
        started = time.perf_counter()
        while sent < args.count:
            n = min(args.batch_size, args.count - sent)
            batch = []
            for i in range(sent, sent + n):
                message: dict[str, Any] = {"body": body}
                if args.keys:
                    message["keys"] = [f"{args.key_prefix}{i}"]
                if args.tags:
                    message["tags"] = args.tags
                batch.append(message)
            batch_results = client.send(args.topic, batch, queue_id=args.queue_id, sharding_key=args.sharding_key,
                                        delay_ms=args.delay_ms, deliver_at_ms=args.deliver_at,
                                        delay_level=args.delay_level, transaction=args.transaction,
                                        producer_group=args.producer_group if args.transaction else None)
            if args.json or args.count <= 20:
                results.extend(batch_results)
            sent += n
            bar.update(n)
        elapsed = time.perf_counter() - started
    rate = sent / elapsed if elapsed > 0 else float("inf")
    summary = {"sent": sent, "seconds": round(elapsed, 3), "messages_per_second": round(rate),
               "megabytes_per_second": round(rate * len(body) / 1e6, 2), "results": results}
    lines = [f"{r['status']} id={r['msg_id']} queue={r['queue_id']} offset={r['queue_offset']}" for r in results]
    if args.transaction:
        lines.append("half messages: commit or roll back each with `transaction --commit ID` / `--rollback ID`")
    elif args.delay_ms is not None or args.deliver_at is not None or args.delay_level is not None:
        lines.append("delayed: each reaches its queue at its deliver time")
    lines.append(f"sent {sent} messages in {elapsed:.3f} s: {rate:,.0f} msg/s, {summary['megabytes_per_second']} MB/s")
    _emit(args, summary, "\n".join(lines))
    return 0


def cmd_consume(args: argparse.Namespace) -> int:
    if args.pop:
        return _consume_pop(args)
    with _client(args, timeout_ms=args.timeout_ms + args.wait_ms) as client:
        topics = {t["topic"]: t["queue_count"] for t in client.list_topics()}
        if args.topic not in topics:
            print(f"error: topic {args.topic!r} does not exist", file=sys.stderr)
            return 1
        queues = [args.queue_id] if args.queue_id is not None else list(range(topics[args.topic]))
        messages: list[dict[str, Any]] = []
        for queue_id in queues:
            offset = args.offset
            if args.since_ms is not None:  # query by time: the first message stored at or after it
                offset = client.offset_for_time(args.topic, queue_id, args.since_ms)
            if args.group:
                committed = client.fetch_offset(args.group, args.topic, queue_id)
                offset = committed if committed >= 0 else args.offset
            while len(messages) < args.count:
                reply = client.pull(args.topic, queue_id, offset, max_messages=min(256, args.count - len(messages)),
                                    max_wait_ms=args.wait_ms, subscription=args.subscription)
                messages.extend(reply["messages"])
                moved = reply["next_offset"] != offset
                offset = reply["next_offset"]
                if reply["status"] not in ("FOUND", "NO_MATCHED_MESSAGE") or not moved:
                    break
            if args.group:
                client.commit_offset(args.group, args.topic, queue_id, offset)
    _emit(args, messages, "\n".join(_message_line(m) for m in messages) + f"\n{len(messages)} messages")
    return 0


def _consume_pop(args: argparse.Namespace) -> int:
    """Pop up to --count messages for --group (acked with --ack); stop at the first empty pop."""
    if not args.group:
        print("error: --pop needs --group", file=sys.stderr)
        return 2
    messages: list[dict[str, Any]] = []
    with _client(args, timeout_ms=args.timeout_ms + args.wait_ms) as client:
        while len(messages) < args.count:
            popped = client.pop(args.group, args.topic, queue_id=args.queue_id,
                                max_messages=min(256, args.count - len(messages)), invisible_ms=args.invisible_ms,
                                max_wait_ms=args.wait_ms, subscription=args.subscription)
            if not popped:
                break
            if args.ack:
                failed = client.ack(args.group, popped)
                for refusal in failed:
                    print(f"not acked: {refusal['receipt_handle']}: {refusal['error']['message']}", file=sys.stderr)
            messages.extend(popped)
    text = "\n".join(f"{_message_line(m)} attempt={m['attempt']}" for m in messages)
    verb = "popped and acked" if args.ack else f"popped (invisible for {args.invisible_ms} ms, not acked)"
    _emit(args, messages, f"{text}\n{len(messages)} messages {verb}")
    return 0


_OFFSET_MSG_ID_CHARS = 32


def cmd_query(args: argparse.Namespace) -> int:
    with _client(args, timeout_ms=args.timeout_ms) as client:
        if args.id and args.topic and len(args.id) != _OFFSET_MSG_ID_CHARS:
            # a client-made id (UNIQ_KEY), as RocketMQ 5 clients show it: found through the index
            messages = [m for m in client.query_by_key(args.topic, args.id, max_results=args.max_results)
                        if m["uniq_key"] == args.id]
        elif args.id:
            messages = [client.get_by_id(args.id)]
        elif args.offset is not None:
            messages = [client.get_by_offset(args.offset)]
        else:
            if not (args.topic and args.key):
                print("error: give --id, or --topic and --key", file=sys.stderr)
                return 2
            messages = client.query_by_key(args.topic, args.key, begin_timestamp=args.begin, end_timestamp=args.end,
                                           max_results=args.max_results)
    _emit(args, messages, "\n".join(_message_line(m) for m in messages) + f"\n{len(messages)} messages")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    if args.topic is None:
        return _engine_stats(args)
    with _client(args, timeout_ms=args.timeout_ms) as client:
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
             f"({r['message_count']} messages), last stored {r['latest_store_timestamp']}" + _group_text(args, r)
             for r in rows]
    _emit(args, rows, "\n".join(lines))
    return 0


def _engine_stats(args: argparse.Namespace) -> int:
    """Engine-wide figures: the log's offsets, topics, and the messages waiting in the timer and
    for a transaction decision."""
    with _client(args, timeout_ms=args.timeout_ms) as client:
        status = client.status()
    offsets = status["offsets"]
    summary = {"topics": status["topics"], "flush_mode": status["flush_mode"], **offsets}
    text = (f"{status['topics']} topics, log {offsets['min_offset']}..{offsets['confirmed_offset']} "
            f"(flushed to {offsets['flushed_offset']}, {status['flush_mode']})\n"
            f"timers pending: {offsets['timers_pending']}; half messages without a decision: "
            f"{offsets['halves_pending']}")
    _emit(args, summary, text)
    return 0


def cmd_transaction(args: argparse.Namespace) -> int:
    with _client(args, timeout_ms=args.timeout_ms) as client:
        if args.checks:
            checks = client.transaction_checks(args.producer_group, max_wait_ms=args.wait_ms)
            lines = [f"{c['msg_id']} -> {c['topic']}/{c['queue_id']} checked {c['check_times']} times, "
                     f"body={_printable(c['body'])[:60]!r}" for c in checks]
            _emit(args, checks, "\n".join(lines) or "no half message waits for a decision")
            return 0
        msg_id, decision = (args.commit, "commit") if args.commit else (args.rollback, "rollback")
        stands = client.end_transaction(msg_id, decision)
    _emit(args, {"msg_id": msg_id, "decision": stands}, f"{msg_id}: {stands}")
    return 0


def _is_pop_group(client: StoreClient, group: str, topic: str) -> bool:
    """A group pops a topic unless it commits offsets on it (the engine refuses pop_stats then)."""
    try:
        return client.pop_stats(group, topic, 0)["pop_cursor"] >= 0
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


def cmd_topics(args: argparse.Namespace) -> int:
    with _client(args, timeout_ms=args.timeout_ms) as client:
        if args.create:
            created = client.create_topic(args.create, queue_count=args.queues)
            _emit(args, created, f"topic {created['topic']} has {created['queue_count']} queues")
            return 0
        if args.delete:
            deleted = client.delete_topic(args.delete)
            _emit(args, deleted, f"topic {deleted['topic']} deleted; its records stay in the log until retention")
            return 0
        topics = client.list_topics()
    _emit(args, topics, "\n".join(f"{t['topic']}\t{t['queue_count']} queues" for t in topics) or "no topics")
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    try:
        public_file, secret_file = keygen(args.dir, args.name)
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    keys = CurveKeys.from_files(public_file, secret_file)
    facts = {"public_key_file": str(public_file), "secret_key_file": str(secret_file),
             "public_key": keys.public_key, "secret_key": keys.secret_key}
    _emit(args, facts, f"public key  {keys.public_key}  ({public_file}: give it to the other side)\n"
                       f"secret key  {keys.secret_key}  ({secret_file}: keep it private)")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from engine.offline.inspect_store import inspect_store, render

    if not args.store_dir:
        print("error: inspect reads a store directory offline; give --store-dir", file=sys.stderr)
        return 2
    with StageBars(enabled=False if args.json else None) as bars:
        report = inspect_store(args.store_dir, segment_size_bytes=args.segment_size_bytes,
                               records_max=args.records, config_path=args.config, progress=bars)
    _emit(args, report, render(report))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from engine.config import StoreConfig
    from engine.offline.check import check_store

    if not args.store_dir:
        print("error: check reads a store directory offline; give --store-dir", file=sys.stderr)
        return 2
    config = StoreConfig.load(args.config)
    if args.repair:
        from engine.offline.repair import StoreBusy, rebuild_derived

        try:
            with StageBars(enabled=False if args.json else None) as bars:
                report = rebuild_derived(args.store_dir, config, progress=bars)
        except StoreBusy as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"rebuilt queues and index from {report.records} records (log end {report.log_end}, "
              f"{report.damaged_ranges} damaged ranges); the old files are in {report.evidence_dir}",
              file=sys.stderr)
    with StageBars(enabled=None if not args.json else False) as bars:
        findings = check_store(args.store_dir, config, progress=bars)
    _emit(args, [f.__dict__ for f in findings],
          "\n".join(str(f) for f in findings) or f"{args.store_dir}: no problems found")
    return 1 if findings else 0


def _common(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("engine connection")
    where.add_argument("--endpoint", metavar="URL", help=f"the engine's client endpoint (default {DEFAULT_ENDPOINT})")
    where.add_argument("--store-dir", type=Path, metavar="DIR",
                       help="reach the engine running on this store directory (its endpoint is read from it)")
    where.add_argument("--timeout-ms", type=int, default=10_000, metavar="MS",
                       help="deadline of each request, in ms (default 10000)")
    where.add_argument("--server-key", type=Path, metavar="FILE", help="CURVE: the engine's public key file (NAME.key)")
    where.add_argument("--client-key", type=Path, metavar="FILE",
                       help="CURVE: this client's secret key file (NAME.key_secret)")
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout (and no progress bar)")


def _epoch_ms(text: str) -> int:
    """A time as epoch ms, from digits or from ISO 8601 (a time without a zone is UTC)."""
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither epoch ms nor an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


_HELP = argparse.RawDescriptionHelpFormatter

# The examples under each command's --help (%(prog)s is how it was run: "rmqpy produce" or
# "python -m engine produce"), written as a user types them.
_EXAMPLES = {
    "": """examples:
  %(prog)s topics --create orders --queues 4
  %(prog)s produce --topic orders --count 10000 --batch-size 100 --keys --tags TagA
  %(prog)s consume --topic orders --group billing --wait-ms 5000

Shell completion (bash): eval "$(register-python-argcomplete rmqpy)"

Each command has its own --help with examples. Online commands reach the engine at
--endpoint, or at the endpoint of the engine running on --store-dir; offline ones
(inspect, check, keygen) read or write files only.""",
    "produce": """examples:
  %(prog)s --topic orders --body "hello"
  %(prog)s --topic orders --count 10000 --batch-size 100 --keys --tags TagA   # a bar on a terminal
  %(prog)s --topic orders --body "reminder" --delay-ms 30000   # delivered in 30 s""",
    "consume": """examples:
  %(prog)s --topic orders --queue-id 0 --count 5
  %(prog)s --topic orders --group billing --subscription "paid || refunded" --wait-ms 5000
  %(prog)s --topic jobs --group workers --pop --ack --count 500 --wait-ms 1000""",
    "query": """examples:
  %(prog)s --topic orders --key key-42
  %(prog)s --id 7F00000100002A9F0000000000000000
  %(prog)s --offset 0 --json                   # the record at commit log offset 0""",
    "stats": """examples:
  %(prog)s                                     # engine-wide: log offsets, timers, open transactions
  %(prog)s --topic orders                      # per queue: offsets, counts, last store time
  %(prog)s --topic orders --group billing      # and the group's committed offsets and lag""",
    "topics": """examples:
  %(prog)s
  %(prog)s --create orders --queues 8
  %(prog)s --delete orders""",
    "inspect": """examples:
  %(prog)s --store-dir /var/lib/rmqpy
  %(prog)s --store-dir /var/lib/rmqpy --records 100 --json > inspect.json
  %(prog)s --store-dir copy-of-broker-store --config engine.toml""",
    "check": """examples:
  %(prog)s --store-dir /var/lib/rmqpy --config /etc/rmqpy/engine.toml
  %(prog)s --store-dir /var/lib/rmqpy --json
  %(prog)s --store-dir /var/lib/rmqpy --repair   # the engine must be stopped

Exit status: 0 when nothing is found, 1 with findings (each printed on a line).""",
    "keygen": """examples:
  %(prog)s --dir keys --name server                # the engine's key pair
  %(prog)s --dir billing-keys --name billing       # one pair per client, kept by the client
  cp billing-keys/billing.key keys/clients/        # the engine allows keys/clients/*.key: public keys only""",
    "transaction": """examples:
  %(prog)s --commit 7F00000100002A9F00000000000A1B2C
  %(prog)s --rollback 7F00000100002A9F00000000000A1B2C
  %(prog)s --checks --producer-group cli-producers --wait-ms 5000""",
}


def _command(commands: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text,
                                                          epilog=_EXAMPLES[name], formatter_class=_HELP)
    return parser


def build_parser(prog: str = "python -m engine") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Send, receive and look up messages of a running "
                                     "engine; inspect and check a store's files offline.", epilog=_EXAMPLES[""],
                                     formatter_class=_HELP)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_produce(_command(commands, "produce", "send messages"))
    _add_consume(_command(commands, "consume", "pull messages, or pop them (--pop) and ack them (--ack)"))
    _add_query(_command(commands, "query", "look messages up by key, by id or by log offset"))
    stats = _command(commands, "stats", "per-queue offsets, counts, store times, and a group's lag")
    _common(stats)
    stats.add_argument("--topic", help="per-queue figures of this topic (default: engine-wide figures, with the "
                                       "timers and half messages pending)")
    stats.add_argument("--group", help="also show this consumer group's committed offsets and lag, or, for a "
                                       "pop group, its ack floor, in-flight, redelivered and dead-lettered counts")
    stats.set_defaults(handler=cmd_stats)
    topics = _command(commands, "topics", "list, create, grow or delete topics")
    _common(topics)
    action = topics.add_mutually_exclusive_group()
    action.add_argument("--create", metavar="TOPIC", help="create TOPIC, or grow it to --queues queues")
    action.add_argument("--delete", metavar="TOPIC", help="delete TOPIC: its queues and consumer offsets")
    topics.add_argument("--queues", type=int, metavar="N",
                        help="with --create: the number of queues (default: the engine's topic_queue_count_default)")
    topics.set_defaults(handler=cmd_topics)
    _add_offline(commands)
    transaction = _command(commands, "transaction", "decide half messages, or list those waiting for a decision")
    _common(transaction)
    decide = transaction.add_mutually_exclusive_group(required=True)
    decide.add_argument("--commit", metavar="ID", help="commit the half message ID (the id its send printed)")
    decide.add_argument("--rollback", metavar="ID", help="roll back the half message ID")
    decide.add_argument("--checks", action="store_true",
                        help="list the half messages of --producer-group waiting for a decision")
    transaction.add_argument("--producer-group", default="cli-producers", metavar="GROUP",
                             help="with --checks: the producer group whose halves to list (default cli-producers)")
    transaction.add_argument("--wait-ms", type=int, default=0, metavar="MS",
                             help="with --checks: wait this long for one (default 0)")
    transaction.set_defaults(handler=cmd_transaction)
    return parser


def _add_produce(produce: argparse.ArgumentParser) -> None:
    _common(produce)
    produce.add_argument("--topic", required=True, help="the topic to send to (created on first use unless the "
                                                        "engine has auto_create_topic = false)")
    produce.add_argument("--count", type=int, default=1, metavar="N",
                         help=f"how many messages (default 1; from {PRODUCE_BAR_COUNT_MIN:,} on, a progress bar "
                              f"on a terminal)")
    produce.add_argument("--body", help="the body text (default: --body-size bytes of 'x')")
    produce.add_argument("--body-size", type=int, default=256, metavar="BYTES",
                         help="the size of the generated body when --body is not given (default 256)")
    produce.add_argument("--batch-size", type=int, default=1, metavar="N",
                         help="messages per send request (default 1)")
    produce.add_argument("--queue-id", type=int, metavar="Q", help="send to this queue (default: the engine picks)")
    produce.add_argument("--sharding-key", metavar="KEY",
                         help="messages with one key go to one queue (per-key order)")
    produce.add_argument("--keys", action="store_true", help="give message i the key <key-prefix><i>")
    produce.add_argument("--key-prefix", default="key-", metavar="TEXT", help="with --keys (default key-)")
    produce.add_argument("--tags", metavar="TAG", help="the tag of every message (consumers filter on it)")
    timing = produce.add_mutually_exclusive_group()
    timing.add_argument("--delay-ms", type=int, metavar="MS",
                        help="deliver this many ms from now (a delayed message)")
    timing.add_argument("--deliver-at", type=_epoch_ms, metavar="TIME",
                        help="deliver at this time: epoch ms, or ISO 8601 such as 2026-11-25T10:00:00Z")
    timing.add_argument("--delay-level", type=int, metavar="LEVEL",
                        help="RocketMQ 4's delay level: 1 = 1 s ... 18 = 2 h")
    timing.add_argument("--transaction", action="store_true",
                        help="store half messages, invisible until `transaction --commit` (see --producer-group)")
    produce.add_argument("--producer-group", default="cli-producers", metavar="GROUP",
                         help="with --transaction: the group whose producers answer the checks (default cli-producers)")
    produce.set_defaults(handler=cmd_produce)


def _add_consume(consume: argparse.ArgumentParser) -> None:
    _common(consume)
    consume.add_argument("--topic", required=True, help="the topic to read")
    consume.add_argument("--queue-id", type=int, metavar="Q", help="one queue (default: all queues of the topic)")
    consume.add_argument("--offset", type=int, default=0, metavar="N",
                         help="the queue offset to start at (default 0; a group's committed offset wins)")
    consume.add_argument("--since-ms", type=int, metavar="MS",
                         help="start at the first message stored at or after this time (ms since the epoch; a "
                              "group's committed offset wins)")
    consume.add_argument("--count", type=int, default=100, metavar="N",
                         help="the most messages to print (default 100)")
    consume.add_argument("--group", help="consumer group: start at its committed offset, commit where it stopped")
    consume.add_argument("--subscription", default="*", metavar="EXPR",
                         help='tags to receive: "*" or "tagA || tagB" (default *)')
    consume.add_argument("--wait-ms", type=int, default=0, metavar="MS",
                         help="long polling: wait this long for new messages (default 0)")
    consume.add_argument("--pop", action="store_true",
                         help="pop for --group: each message is invisible to the group's other pops until acked "
                              "or --invisible-ms passes")
    consume.add_argument("--ack", action="store_true", help="with --pop: acknowledge what was popped")
    consume.add_argument("--invisible-ms", type=int, default=30_000, metavar="MS",
                         help="with --pop: how long a message stays invisible before it is redelivered "
                              "(default 30000)")
    consume.set_defaults(handler=cmd_consume)


def _add_query(query: argparse.ArgumentParser) -> None:
    _common(query)
    query.add_argument("--topic", help="with --key: the topic whose index to search")
    query.add_argument("--key", help="a message key (with --topic)")
    query.add_argument("--id", help="a message id: the offsetMsgId, or with --topic the id a RocketMQ 5 "
                                    "client was given (UNIQ_KEY)")
    query.add_argument("--offset", type=int, metavar="N", help="a commit log offset")
    query.add_argument("--begin", type=int, default=0, metavar="MS",
                       help="with --key: earliest store time, ms since the epoch")
    query.add_argument("--end", type=int, default=0x7FFFFFFFFFFFFFFF, metavar="MS",
                       help="with --key: latest store time, ms since the epoch")
    query.add_argument("--max-results", type=int, default=64, metavar="N",
                       help="with --key: the most messages to return (default 64)")
    query.set_defaults(handler=cmd_query)


def _add_offline(commands: Any) -> None:
    inspect = _command(commands, "inspect", "dump a store directory offline: segments, records, queues, index, "
                                            "checkpoint")
    inspect.add_argument("--store-dir", type=Path, metavar="DIR", help="the store directory to read")
    inspect.add_argument("--config", type=Path, metavar="FILE", help="the TOML the store was written with")
    inspect.add_argument("--segment-size-bytes", type=int, metavar="BYTES",
                         help="override the segment size (default: the size of the files)")
    inspect.add_argument("--records", type=int, default=20, metavar="N", help="how many records to list (default 20)")
    inspect.add_argument("--json", action="store_true", help="machine-readable output (and no progress display)")
    inspect.set_defaults(handler=cmd_inspect)
    check = _command(commands, "check", "verify a store offline (CRCs, queues, index, checkpoint)")
    check.add_argument("--store-dir", type=Path, metavar="DIR", help="the store directory to verify")
    check.add_argument("--config", type=Path, metavar="FILE", help="the TOML the store was written with")
    check.add_argument("--json", action="store_true", help="machine-readable output (and no progress bars)")
    check.add_argument("--repair", action="store_true",
                       help="first rebuild queues and index from the log (the store must be stopped)")
    check.set_defaults(handler=cmd_check)
    keygen = _command(commands, "keygen", "make a CURVE key pair (NAME.key, NAME.key_secret)")
    keygen.add_argument("--dir", type=Path, required=True, help="where to write the two files")
    keygen.add_argument("--name", required=True, help="file name stem, e.g. server or billing-service")
    keygen.add_argument("--json", action="store_true", help="machine-readable output")
    keygen.set_defaults(handler=cmd_keygen)


def main(argv: list[str] | None = None) -> int:
    """``rmqpy`` and ``python -m engine``."""
    parser = build_parser("rmqpy" if Path(sys.argv[0]).name == "rmqpy" else "python -m engine")
    argcomplete.autocomplete(parser)  # answers a completing shell and exits; otherwise does nothing
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except NotRunning as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
