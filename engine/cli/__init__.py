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
import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import argcomplete
import zmq

from engine.client import (
    DEFAULT_ENDPOINT,
    ClientError,
    EngineError,
    EngineUnreachable,
    RequestTimeout,
    StoreClient,
    engine_answers,
    master_of_set,
)
from engine.ipc.curve import CurveKeys, keygen
from engine.ipc.endpoints import NotRunning, read_engine_state
from engine.layout import PROPERTY_UNIQ_KEY as UNIQ_KEY
from engine.progress import StageBars, count_bar
from engine.store.system_topics import (
    HALF_TOPIC,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_OUT_MS,
    TIMER_TOPIC,
)
from engine.version import package_version
from rmqpy._channel import Channel
from rmqpy._send import UniqKeys

if TYPE_CHECKING:
    from engine.cli_cluster import SpreadSends

PRODUCE_BAR_COUNT_MIN = 1_000  # produce draws a progress bar (on a terminal) from this many messages on

# Exit codes (docs/client.md, "Exit codes of rmqpy"): every path ends in one of these, with one
# line on stderr saying why (none for a closed pipe: `rmqpy consume ... | head` is not an error).
EXIT_OK = 0
EXIT_FAILED = 1  # the engine refused the request, or what was asked is not there (check: findings)
EXIT_USAGE = 2  # a bad command line (argparse's own code)
EXIT_NO_ENGINE = 3  # nothing accepts a connection at the endpoint, or no engine runs on --store-dir
EXIT_TIMEOUT = 4  # the engine took a request but sent no reply before --timeout-ms
EXIT_OS_ERROR = 5  # a local file or directory could not be read or written
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_BROKEN_PIPE = 141  # stdout was closed by its reader (128 + SIGPIPE)


def _endpoint(args: argparse.Namespace) -> str:
    if args.endpoint:
        return args.endpoint
    if args.store_dir:
        return str(read_engine_state(args.store_dir)["endpoint"])
    return DEFAULT_ENDPOINT


def _curve_keys(args: argparse.Namespace) -> CurveKeys | None:
    if not (args.server_key or args.client_key):
        return None
    if not (args.server_key and args.client_key):
        print("error: CURVE needs both --server-key and --client-key", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    return CurveKeys.from_files(args.server_key, args.client_key)


def _client(args: argparse.Namespace, *, timeout_ms: int, kind: type[StoreClient] = StoreClient) -> StoreClient:
    curve = _curve_keys(args)
    endpoint = _endpoint(args)
    if "," in endpoint:  # a broker set's engines: the one its route names master
        members = [part.strip() for part in endpoint.split(",") if part.strip()]
        endpoint = master_of_set(members) or members[0]
    try:
        answers = engine_answers(endpoint)  # at once, rather than at the end of the deadline
    except zmq.ZMQError as exc:  # not an endpoint ZeroMQ can connect to: "foo", "tcp://host" without a port
        print(f"error: --endpoint {endpoint!r}: {exc.strerror} (the form is tcp://HOST:PORT or ipc://PATH)",
              file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    if not answers:
        raise EngineUnreachable(endpoint)

    def following(master: str) -> None:
        print(f"note: {endpoint} is a replica; sending to its master, {master}", file=sys.stderr)

    return kind(endpoint, timeout_ms=timeout_ms, curve=curve, on_master=following)


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
    """One message on one line; fields a message does not have (no tags, no keys) are left out."""
    body = _printable(m["body"])
    shown = body if len(body) <= 60 else body[:57] + "..."
    where = (f"{m['broker_name']}:" if "broker_name" in m else "") + f"{m['topic']}/{m['queue_id']}"
    parts = [f"{where}@{m['queue_offset']}", f"id={m['msg_id']}"]
    if m.get("uniq_key"):
        parts.append(f"uniq_key={m['uniq_key']}")
    if m.get("tags") is not None:
        parts.append(f"tags={m['tags']}")
    if m.get("keys"):
        parts.append(f"keys={','.join(m['keys'])}")
    properties = m.get("properties") or {}
    if PROPERTY_REAL_TOPIC in properties:  # a delayed or half message waiting in a system topic
        parts.append(f"waiting for {properties[PROPERTY_REAL_TOPIC]}/{properties.get(PROPERTY_REAL_QID, '?')}")
    parts.append(f"body={shown!r}")
    return " ".join(parts)


def cmd_produce(args: argparse.Namespace) -> int:
    body = args.body.encode() if args.body is not None else b"x" * args.body_size
    bar = count_bar(args.count, desc="produce", unit=" msg",
                    enabled=False if args.json or args.count < PRODUCE_BAR_COUNT_MIN else None)
    # The results shown name each message by its uniq key, the id consumers get (the same across a
    # delay or a transaction): made here, as rmqpy's producer does. Unshown, the engine makes them.
    shown = args.json or args.count <= 20
    uniq_keys = UniqKeys()
    sent = 0
    results: list[dict[str, Any]] = []
    interrupted = False
    started = time.perf_counter()
    with _send_targets(args) as targets, bar:
        existed = targets.client is None or args.topic in {t["topic"] for t in targets.client.list_topics()}
        try:
            while sent < args.count:
                n = min(args.batch_size, args.count - sent)
                batch = []
                for i in range(sent, sent + n):
                    message: dict[str, Any] = {"body": body}
                    if shown:
                        message["properties"] = {UNIQ_KEY: uniq_keys.next()}
                    if args.keys:
                        message["keys"] = [f"{args.key_prefix}{i}"]
                    if args.tags:
                        message["tags"] = args.tags
                    batch.append(message)
                client, queue_id, broker = targets.next()
                batch_results = client.send(args.topic, batch, queue_id=queue_id,
                                            sharding_key=args.sharding_key if broker is None else None,
                                            delay_ms=args.delay_ms,
                                            deliver_at_ms=args.deliver_at, delay_level=args.delay_level,
                                            transaction=args.transaction,
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
    lines.append(f"{'interrupted: ' if interrupted else ''}sent {_plural(sent, 'message')} in {elapsed:.3f} s: "
                 f"{rate:,.0f} msg/s, {summary['megabytes_per_second']} MB/s")
    _emit(args, summary, "\n".join(lines))
    return EXIT_INTERRUPTED if interrupted else EXIT_OK


class OneEngine:
    """Where each batch of ``produce`` goes without ``--cluster``: (its engine, --queue-id, no broker)."""

    def __init__(self, client: StoreClient, queue_id: int | None) -> None:
        self.client = client
        self.queue_id = queue_id

    def __enter__(self) -> OneEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def next(self) -> tuple[StoreClient, int | None, str | None]:
        return self.client, self.queue_id, None


def _send_targets(args: argparse.Namespace) -> OneEngine | SpreadSends:
    """Where ``produce`` sends: one engine, or with ``--cluster`` each batch to a queue of the route."""
    if args.cluster is None:
        return OneEngine(_client(args, timeout_ms=args.timeout_ms), args.queue_id)
    from engine.cli_cluster import SpreadSends, cluster_route  # etcd's client only when asked for

    curve = _curve_keys(args)
    return SpreadSends(args, cluster_route(args),
                       lambda master: StoreClient(master, timeout_ms=args.timeout_ms, curve=curve))


def _say_created(client: StoreClient, topic: str) -> None:
    """A send to an unknown topic created it (``auto_create_topic``): tell the user, who may have
    mistyped the name."""
    queues = {t["topic"]: t["queue_count"] for t in client.list_topics()}.get(topic)
    if queues is not None:
        print(f"created topic {topic} with {_plural(queues, 'queue')} (auto-create)", file=sys.stderr)


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


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def cmd_consume(args: argparse.Namespace) -> int:
    if args.pop and not args.group:
        print("error: --pop needs --group", file=sys.stderr)
        return EXIT_USAGE
    gather = _pop_messages if args.pop else _pull_messages
    errors: list[str] = []  # printed after the messages

    def consume_one(one: argparse.Namespace) -> list[dict[str, Any]]:
        messages, refusals = gather(one)
        errors.extend(refusals)
        return messages

    if args.cluster is None:
        messages = consume_one(args)
    else:
        from engine.cli_cluster import cluster_route, consume_sets  # etcd's client only when asked for

        messages = consume_sets(args, cluster_route(args), consume_one)
    if args.pop:
        lines = [f"{_message_line(m)} attempt={m['attempt']}" for m in messages]
        verb = "popped and acked" if args.ack else f"popped (invisible for {args.invisible_ms} ms, not acked)"
        _emit(args, messages, "\n".join([*lines, f"{_plural(len(messages), 'message')} {verb}"]))
    else:
        _emit(args, messages, "\n".join([*(_message_line(m) for m in messages), _plural(len(messages), "message")]))
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    return EXIT_FAILED if errors else EXIT_OK


def _pull_messages(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    """Up to --count messages pulled from the engine of ``args``, and why a queue could not be read."""
    with _client(args, timeout_ms=args.timeout_ms, kind=Channel) as client:
        assert isinstance(client, Channel)
        topics = {t["topic"]: t["queue_count"] for t in client.list_topics()}
        if args.topic not in topics:
            print(f"error: topic {args.topic!r} does not exist", file=sys.stderr)
            raise SystemExit(EXIT_FAILED)
        queues = [args.queue_id] if args.queue_id is not None else list(range(topics[args.topic]))
        pulls = _Pulls(client, args)
        for queue_id in queues:
            offset = args.offset
            if args.since_ms is not None:  # query by time: the first message stored at or after it
                offset = client.offset_for_time(args.topic, queue_id, args.since_ms)
            if args.group:
                committed = client.fetch_offset(args.group, args.topic, queue_id)
                offset = committed if committed >= 0 else offset
            pulls.offsets[queue_id] = offset
        started = dict(pulls.offsets)
        for queue_id in queues:  # what is there now, from every queue
            pulls.drain(queue_id)
        if not pulls.messages and args.wait_ms > 0:
            pulls.wait_any([q for q in queues if q not in pulls.overflowed])
        if args.group:
            for queue_id, offset in pulls.offsets.items():
                if queue_id not in pulls.overflowed and offset != started[queue_id]:
                    client.commit_offset(args.group, args.topic, queue_id, offset)
    errors = [f"{args.topic}/{queue_id}: offset {pulls.offsets[queue_id]} is past the end of the queue "
              f"({reply['status']}); its valid offsets are {reply['min_offset']}..{reply['max_offset']}"
              for queue_id, reply in pulls.overflowed.items()]
    return pulls.messages, errors


_PULL_AGAIN = ("FOUND", "NO_MATCHED_MESSAGE", "MESSAGE_WAS_REMOVING", "OFFSET_TOO_SMALL")
_OVERFLOWED = "OFFSET_OVERFLOW_BADLY"


class _Pulls:
    """One consume's pulls: each queue's offset and the messages gathered, up to ``--count``.

    First every queue is read as far as it goes without waiting. Only when that finds nothing
    does ``--wait-ms`` apply, and then to all the queues at once: one parked pull per queue,
    and the first to bring messages ends the wait (queue by queue, an empty topic of N queues
    took N times the wait, and a message on the last queue waited for every queue before it).
    """

    def __init__(self, client: Channel, args: argparse.Namespace) -> None:
        self.client = client
        self.args = args
        self.offsets: dict[int, int] = {}
        self.messages: list[dict[str, Any]] = []
        self.overflowed: dict[int, dict[str, Any]] = {}  # queue -> the pull reply that said so

    def _fields(self, queue_id: int) -> dict[str, Any]:
        return {"topic": self.args.topic, "queue_id": queue_id, "offset": self.offsets[queue_id],
                "max_messages": min(256, self.args.count - len(self.messages)), "max_bytes": 4 * 1024 * 1024,
                "subscription": self.args.subscription}

    def take(self, queue_id: int, reply: dict[str, Any]) -> bool:
        """Keep a pull reply's messages and move the queue's offset; True if the queue may have more."""
        if reply["status"] == _OVERFLOWED:
            self.overflowed[queue_id] = reply
            return False
        self.messages.extend(reply["messages"])
        moved = reply["next_offset"] != self.offsets[queue_id]
        self.offsets[queue_id] = reply["next_offset"]
        return moved and reply["status"] in _PULL_AGAIN

    def drain(self, queue_id: int) -> None:
        while len(self.messages) < self.args.count:
            if not self.take(queue_id, self.client.request("pull", **self._fields(queue_id))):
                return

    def wait_any(self, queues: list[int]) -> None:
        """Park a pull on each queue; return when one brings messages (read the rest of that queue)
        or when ``--wait-ms`` is over."""
        deadline = time.monotonic() + self.args.wait_ms / 1000
        waiting: dict[int, int] = {}  # request id -> queue

        def park(queue_id: int) -> None:
            wait_ms = int((deadline - time.monotonic()) * 1000)
            if wait_ms > 0:
                request_id = self.client.submit("pull", wait_ms=wait_ms, max_wait_ms=wait_ms, **self._fields(queue_id))
                waiting[request_id] = queue_id

        for queue_id in queues:
            park(queue_id)
        while waiting and not self.messages:
            for request_id, outcome in self.client.replies(self.args.timeout_ms + self.args.wait_ms):
                queue_id = waiting.pop(request_id)
                if isinstance(outcome, ClientError):
                    raise outcome
                before = len(self.messages)
                if self.take(queue_id, outcome) and len(self.messages) == before:
                    park(queue_id)  # moved past messages the subscription filters out: wait on
        for queue_id in {m["queue_id"] for m in self.messages}:
            self.drain(queue_id)


def _pop_messages(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    """Pop up to --count messages for --group (acked with --ack); stop at the first empty pop."""
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
    return messages, []


def cmd_query(args: argparse.Namespace) -> int:
    with _client(args, timeout_ms=args.timeout_ms) as client:
        if args.id:
            messages = _by_id(client, args)
            if not messages:
                print(f"error: no message has the id {args.id}" + ("" if args.topic else
                      " (a uniq_key is found with --topic)"), file=sys.stderr)
                return EXIT_FAILED
        elif args.offset is not None:
            messages = [client.get_by_offset(args.offset)]
        else:
            if not (args.topic and args.key):
                print("error: give --id, or --topic and --key", file=sys.stderr)
                return EXIT_USAGE
            messages = client.query_by_key(args.topic, args.key, begin_timestamp=args.begin, end_timestamp=args.end,
                                           max_results=args.max_results)
    _emit(args, messages, "\n".join([*(_message_line(m) for m in messages), _plural(len(messages), "message")]))
    return EXIT_OK


def _by_id(client: StoreClient, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The messages with this id: with ``--topic``, first the ones whose ``uniq_key`` it is (the
    id RocketMQ 5 clients and ``produce`` show; 32 hex digits, as an offset id is), then the
    record the id names as an offset id (commit log offset and host), if it is that record's."""
    if args.topic:
        found = [m for m in client.query_by_key(args.topic, args.id, max_results=args.max_results)
                 if m["uniq_key"] == args.id]
        if found:
            return found
        for waiting_in in (TIMER_TOPIC, HALF_TOPIC):  # not delivered yet: its waiting record
            found += [m for m in client.query_by_key(waiting_in, args.id, max_results=args.max_results)
                      if m["uniq_key"] == args.id and m["properties"].get(PROPERTY_REAL_TOPIC) == args.topic]
        if found:
            return found
    try:
        record = client.get_by_id(args.id)
    except EngineError as exc:
        if exc.name == "MESSAGE_NOT_FOUND" or (args.topic and exc.name == "INVALID_MSG_ID"):
            return []
        raise
    return [record] if record["msg_id"] == args.id.upper() else []  # any 32 hex digits name some offset


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
             f"({_plural(r['message_count'], 'message')}), last stored {r['latest_store_timestamp']}"
             + _group_text(args, r) for r in rows]
    _emit(args, rows, "\n".join(lines))
    return 0


def _engine_stats(args: argparse.Namespace) -> int:
    """Engine-wide figures: the log's offsets, topics, and the messages waiting in the timer and
    for a transaction decision."""
    with _client(args, timeout_ms=args.timeout_ms) as client:
        status = client.status()
        topics = len(client.list_topics())  # as `topics` lists them: without the system topics
    offsets = status["offsets"]
    system = status["topics"] - topics
    summary = {"topics": topics, "system_topics": system, "flush_mode": status["flush_mode"], **offsets}
    text = (f"{_plural(topics, 'topic')} (+{system} system), "
            f"log {offsets['min_offset']}..{offsets['confirmed_offset']} "
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
    if args.cluster:
        return _cluster_topics(args)
    if args.brokers:
        print("error: --brokers spreads a topic over a cluster's broker sets: give --cluster too", file=sys.stderr)
        return 2
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


def _cluster_topics(args: argparse.Namespace) -> int:
    """``topics --cluster``: the routes in etcd; ``--create`` spreads a topic over broker sets."""
    from engine.coordination.etcd import Etcd, EtcdUnavailable
    from engine.coordination.routes import create_spread_topic, is_etcd_address, read_cluster

    if not is_etcd_address(args.cluster):
        print(f"error: topics --cluster lists and spreads topics in etcd: give its client endpoints "
              f"(http://host:port), not {args.cluster}", file=sys.stderr)
        return EXIT_USAGE
    etcd = Etcd(args.cluster.split(","), timeout_ms=min(args.timeout_ms, 3_000))
    try:
        if args.delete:
            print("error: delete a topic on each broker set that serves it (--endpoint)", file=sys.stderr)
            return 2
        if args.create:
            route = create_spread_topic(etcd, args.cluster_name, args.create, args.queues or 8,
                                        brokers=args.brokers.split(",") if args.brokers else None,
                                        timeout_ms=args.timeout_ms)
            facts = {"topic": route.topic, "brokers": [{"broker_name": b.broker_name, "queue_count": b.queue_count,
                                                        "master_endpoint": b.master_endpoint} for b in route.brokers]}
            _emit(args, facts, "\n".join(f"topic {route.topic}: {b.queue_count} queues on {b.broker_name} "
                                         f"({b.master_endpoint})" for b in route.brokers))
            return 0
        cluster = read_cluster(etcd, args.cluster_name)
    except EtcdUnavailable as exc:
        print(f"error: {exc} (--cluster names etcd's client endpoints, http://host:port)", file=sys.stderr)
        return 1
    lines = [f"{topic}\t" + ", ".join(f"{broker}: {queues} queues" for broker, queues in sorted(brokers.items()))
             for topic, brokers in sorted(cluster["topics"].items())]
    _emit(args, cluster, "\n".join(lines) or f"no topics in cluster {args.cluster_name!r}")
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
    _offline_store(args.store_dir)
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
        from engine.offline.store_dir import engine_running, require_store

        require_store(args.store_dir)
        if engine_running(args.store_dir):
            print(f"error: an engine is running on {args.store_dir}; stop it before --repair", file=sys.stderr)
            return EXIT_FAILED

        try:
            with StageBars(enabled=False if args.json else None) as bars:
                report = rebuild_derived(args.store_dir, config, progress=bars)
        except StoreBusy as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"rebuilt queues and index from {report.records} records (log end {report.log_end}, "
              f"{report.damaged_ranges} damaged ranges); the old files are in {report.evidence_dir}",
              file=sys.stderr)
    else:
        _offline_store(args.store_dir)
    with StageBars(enabled=None if not args.json else False) as bars:
        findings = check_store(args.store_dir, config, progress=bars)
    _emit(args, [f.__dict__ for f in findings],
          "\n".join(str(f) for f in findings) or f"{args.store_dir}: no problems found")
    return 1 if findings else 0


def _offline_store(store_dir: Path) -> None:
    """NotAStore (an OSError: EXIT_OS_ERROR) unless ``store_dir`` is a store; a warning if an engine runs on it."""
    from engine.offline.store_dir import LIVE_WARNING, engine_running, require_store

    require_store(store_dir)
    if engine_running(store_dir):
        print(f"warning: {LIVE_WARNING}", file=sys.stderr)


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    cluster = parser.add_argument_group("a cluster of broker sets (docs/cluster.md)")
    cluster.add_argument("--cluster", metavar="ADDRESS",
                         help="the cluster instead of one engine: etcd's client endpoints (http://host:port, "
                              "comma-separated) or any engine of it (tcp://host:port)")
    cluster.add_argument("--cluster-name", default="DefaultCluster", help="the cluster (default DefaultCluster)")


def _common(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("engine connection")
    where.add_argument("--endpoint", metavar="URL", help=f"the engine's client endpoint (default {DEFAULT_ENDPOINT}); "
                       "a broker set's engines separated by commas: its master")
    where.add_argument("--store-dir", type=Path, metavar="DIR",
                       help="reach the engine running on this store directory (its endpoint is read from it)")
    where.add_argument("--timeout-ms", type=_positive, default=10_000, metavar="MS",
                       help="deadline of each request, in ms (default 10000)")
    where.add_argument("--server-key", type=Path, metavar="FILE", help="CURVE: the engine's public key file (NAME.key)")
    where.add_argument("--client-key", type=Path, metavar="FILE",
                       help="CURVE: this client's secret key file (NAME.key_secret)")
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout (and no progress bar)")


def _positive(text: str) -> int:
    """A count or size: 0 or less is a usage error, caught before anything is sent."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number (1 or more)")
    return value


def _non_negative(text: str) -> int:
    """An offset, a queue number or a time in ms: 0 or more."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


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
(inspect, check, keygen) read or write files only.

Exit status: 0 done, 1 refused or not found, 2 bad command line, 3 no engine answers,
4 no reply in time, 5 a local file error, 130 Ctrl-C (docs/client.md, "Exit codes of rmqpy").""",
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
  %(prog)s --delete orders
  %(prog)s --cluster http://127.0.0.1:2379 --create orders --queues 8 --brokers broker-a,broker-b""",
    "inspect": """examples:
  %(prog)s --store-dir /var/lib/rmqpy
  %(prog)s --store-dir /var/lib/rmqpy --records 100 --json > inspect.json
  %(prog)s --store-dir copy-of-broker-store --config engine.toml

Each segment is read up to its last non-zero byte (the zeros after the log's end are not
damage). A path that is not a store exits 5; on a store a running engine holds, a warning says
the figures are a moment's.""",
    "check": """examples:
  %(prog)s --store-dir /var/lib/rmqpy --config /etc/rmqpy/engine.toml
  %(prog)s --store-dir /var/lib/rmqpy --json
  %(prog)s --store-dir /var/lib/rmqpy --repair   # the engine must be stopped

Exit status: 0 when nothing is found, 1 with findings (each printed on a line), 5 for a path
that is not a store. On a store a running engine holds, check warns that the figures are a
moment's, and --repair refuses (exit 1).""",
    "keygen": """examples:
  %(prog)s --dir keys --name server                # the engine's key pair
  %(prog)s --dir billing-keys --name billing       # one pair per client, kept by the client

Then copy only the client's public key where the engine reads: cp billing-keys/billing.key
keys/clients/ (the engine allows keys/clients/*.key; a secret key there is warned about).""",
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
    topics.add_argument("--queues", type=_positive, metavar="N",
                        help="with --create: the number of queues (default: the engine's topic_queue_count_default; "
                             "8 over a cluster)")
    cluster = topics.add_argument_group("a cluster of broker sets (docs/cluster.md)")
    cluster.add_argument("--cluster", metavar="URLS",
                         help="etcd's client endpoints (http://host:port, comma-separated): list the cluster's "
                              "routes, or spread --create's queues over its broker sets")
    cluster.add_argument("--cluster-name", default="DefaultCluster", help="the cluster (default DefaultCluster)")
    cluster.add_argument("--brokers", metavar="NAMES",
                         help="with --cluster --create: the broker sets to spread over (default: every one)")
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
    transaction.add_argument("--wait-ms", type=_non_negative, default=0, metavar="MS",
                             help="with --checks: wait this long for one (default 0)")
    transaction.set_defaults(handler=cmd_transaction)
    return parser


def _add_produce(produce: argparse.ArgumentParser) -> None:
    _common(produce)
    produce.add_argument("--topic", required=True, help="the topic to send to (created on first use unless the "
                                                        "engine has auto_create_topic = false)")
    produce.add_argument("--count", type=_positive, default=1, metavar="N",
                         help=f"how many messages (default 1; from {PRODUCE_BAR_COUNT_MIN:,} on, a progress bar "
                              f"on a terminal)")
    produce.add_argument("--body", help="the body text (default: --body-size bytes of 'x')")
    produce.add_argument("--body-size", type=_positive, default=256, metavar="BYTES",
                         help="the size of the generated body when --body is not given (default 256)")
    produce.add_argument("--batch-size", type=_positive, default=1, metavar="N",
                         help="messages per send request (default 1)")
    produce.add_argument("--queue-id", type=_non_negative, metavar="Q",
                         help="send to this queue (default: the engine picks)")
    produce.add_argument("--sharding-key", metavar="KEY",
                         help="messages with one key go to one queue (per-key order)")
    produce.add_argument("--keys", action="store_true", help="give message i the key <key-prefix><i>")
    produce.add_argument("--key-prefix", default="key-", metavar="TEXT", help="with --keys (default key-)")
    produce.add_argument("--tags", metavar="TAG", help="the tag of every message (consumers filter on it)")
    timing = produce.add_mutually_exclusive_group()
    timing.add_argument("--delay-ms", type=_non_negative, metavar="MS",
                        help="deliver this many ms from now (a delayed message)")
    timing.add_argument("--deliver-at", type=_epoch_ms, metavar="TIME",
                        help="deliver at this time: epoch ms, or ISO 8601 such as 2026-11-25T10:00:00Z")
    timing.add_argument("--delay-level", type=_positive, metavar="LEVEL",
                        help="RocketMQ 4's delay level: 1 = 1 s ... 18 = 2 h")
    timing.add_argument("--transaction", action="store_true",
                        help="store half messages, invisible until `transaction --commit` (see --producer-group)")
    produce.add_argument("--producer-group", default="cli-producers", metavar="GROUP",
                         help="with --transaction: the group whose producers answer the checks (default cli-producers)")
    add_cluster_options(produce)
    produce.set_defaults(handler=cmd_produce)


def _add_consume(consume: argparse.ArgumentParser) -> None:
    _common(consume)
    consume.add_argument("--topic", required=True, help="the topic to read")
    consume.add_argument("--queue-id", type=_non_negative, metavar="Q",
                         help="one queue (default: all queues of the topic)")
    consume.add_argument("--offset", type=_non_negative, default=0, metavar="N",
                         help="the queue offset to start at (default 0; a group's committed offset wins)")
    consume.add_argument("--since-ms", type=_non_negative, metavar="MS",
                         help="start at the first message stored at or after this time (ms since the epoch; a "
                              "group's committed offset wins)")
    consume.add_argument("--count", type=_positive, default=100, metavar="N",
                         help="the most messages to print (default 100)")
    consume.add_argument("--group", help="consumer group: start at its committed offset, commit where it stopped")
    consume.add_argument("--subscription", default="*", metavar="EXPR",
                         help='tags to receive: "*" or "tagA || tagB" (default *)')
    consume.add_argument("--wait-ms", type=_non_negative, default=0, metavar="MS",
                         help="long polling: when no queue has a message, wait this long for the first one "
                              "on any queue (default 0)")
    consume.add_argument("--pop", action="store_true",
                         help="pop for --group: each message is invisible to the group's other pops until acked "
                              "or --invisible-ms passes")
    consume.add_argument("--ack", action="store_true", help="with --pop: acknowledge what was popped")
    consume.add_argument("--invisible-ms", type=_non_negative, default=30_000, metavar="MS",
                         help="with --pop: how long a message stays invisible before it is redelivered "
                              "(default 30000)")
    add_cluster_options(consume)
    consume.set_defaults(handler=cmd_consume)


def _add_query(query: argparse.ArgumentParser) -> None:
    _common(query)
    query.add_argument("--topic", help="with --key: the topic whose index to search")
    query.add_argument("--key", help="a message key (with --topic)")
    query.add_argument("--id", help="a message id: the offsetMsgId, or with --topic the id a RocketMQ 5 "
                                    "client was given (UNIQ_KEY)")
    query.add_argument("--offset", type=_non_negative, metavar="N", help="a commit log offset")
    query.add_argument("--begin", type=_non_negative, default=0, metavar="MS",
                       help="with --key: earliest store time, ms since the epoch")
    query.add_argument("--end", type=_non_negative, default=0x7FFFFFFFFFFFFFFF, metavar="MS",
                       help="with --key: latest store time, ms since the epoch")
    query.add_argument("--max-results", type=_positive, default=64, metavar="N",
                       help="with --key: the most messages to return (default 64)")
    query.set_defaults(handler=cmd_query)


def _add_offline(commands: Any) -> None:
    inspect = _command(commands, "inspect", "dump a store directory offline: segments, records, queues, index, "
                                            "checkpoint")
    inspect.add_argument("--store-dir", type=Path, metavar="DIR", help="the store directory to read")
    inspect.add_argument("--config", type=Path, metavar="FILE", help="the TOML the store was written with")
    inspect.add_argument("--segment-size-bytes", type=_positive, metavar="BYTES",
                         help="override the segment size (default: the size of the files)")
    inspect.add_argument("--records", type=_non_negative, default=20, metavar="N",
                         help="how many records to list (default 20)")
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
    """``rmqpy`` and ``python -m engine``: the handler's exit code, or one of the EXIT_ codes
    above with one line on stderr, never a traceback."""
    parser = build_parser("rmqpy" if Path(sys.argv[0]).name == "rmqpy" else "python -m engine")
    argcomplete.autocomplete(parser)  # answers a completing shell and exits; otherwise does nothing
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack on stderr
    try:
        args = parser.parse_args(argv)  # --help too may meet a closed pipe
        return int(args.handler(args))
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ClientError, NotRunning, OSError) as exc:
        code = next(code for kind, code in _EXIT_CODES if isinstance(exc, kind))
        try:
            print(f"error: {exc}", file=sys.stderr)
        except BrokenPipeError:
            pass
        return code


# The first match wins: EngineError, FrameTooLarge and the rest of ClientError are refusals.
_EXIT_CODES: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int], ...] = (
    ((EngineUnreachable, NotRunning), EXIT_NO_ENGINE), (RequestTimeout, EXIT_TIMEOUT),
    (ClientError, EXIT_FAILED), (OSError, EXIT_OS_ERROR))


def _stdout_closed() -> int:
    """The reader of stdout went away (``| head``): say nothing, and keep Python's flush at exit
    from failing on the closed pipe (the recipe of the signal module's documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE
