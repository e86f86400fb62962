"""A seeded fuzzer of the client endpoint: hostile requests, and what the engine must do with each.

Every case is one message of frames sent on a DEALER, with what ``docs/protocol.md``
promises for it:

* ``ANSWERED``: one reply, a msgpack map with ``ok``; when ``ok`` is false, an
  ``error`` whose ``code`` and ``name`` are a documented ``ErrorCode`` (1.2, 3.2, 7.3);
* ``IGNORED``: no reply at all (a frame shape other than the two of 1.2);
* ``DROPPED``: no reply, and the connection is closed (a frame over
  ``client_frame_bytes_max``, 1.5), so it goes on a socket of its own.

Classes: garbage bytes, truncated and non-map msgpack, a wrong type for every field of
every operation (huge, negative, bool, float, nil, str for bin and bin for str, deep
nesting, unknown fields), bin keys, invalid names (traversal, NUL, newline, unicode,
128+ characters), oversized bodies and properties, many-frame messages, oversized
frames; and floods (topics, groups, parked long polls) run by ``flood_cases``.
Names that try to escape the store carry ``ESCAPE_MARK`` so that a file made outside
it can be searched for. ``fuzz_wire`` in ``scripts/`` runs it against a live engine.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import psutil
import zmq

from engine.client import StoreClient
from engine.config import StoreConfig
from engine.errors import ErrorCode
from engine.ipc import endpoints
from engine.ipc.control import control
from engine.ipc.messages import StatusQuery
from engine.ipc.protocol import PROTOCOL_VERSION, REQUEST_TYPES
from supervisor.launcher import EngineProcess

ANSWERED, IGNORED, DROPPED = "answered", "ignored", "dropped"
ESCAPE_MARK = "fz-escape"
KNOWN_TOPIC = "fuzz-known"  # the topic whose messages must come through intact: never a fuzz target

_encode = msgspec.msgpack.encode


@dataclass(frozen=True)
class Case:
    kind: str  # the class of input, for the figures
    frames: list[bytes]
    expect: str  # ANSWERED, IGNORED or DROPPED
    request_id: int  # the id the reply must carry (0 when the frame has no readable id)
    refused: bool = False  # the reply must be an error (an invalid name)


def _deep(depth: int) -> bytes:
    """A msgpack array nested ``depth`` levels (built by hand: msgspec refuses to encode it)."""
    return b"\x91" * depth + b"\x00"


def bad_names(rng: random.Random, seed: int) -> list[str]:
    return [f"../../{ESCAPE_MARK}-{seed}", f"/tmp/{ESCAPE_MARK}-{seed}", f"..\\{ESCAPE_MARK}", "..", ".",
            "name\n", "name\r\n", "\nname", "na\x00me", "тема", "name٣", "x" * rng.randint(256, 300), "",
            "a b", "a/b", "TBW102", "rmq_sys_x", "%RETRY%g", "%DLQ%g", "😀", "ｎａｍｅ", "a\tb"]  # noqa: RUF001 - fullwidth on purpose


def _wrong_values(rng: random.Random) -> list[Any]:
    return [2 ** 64 - 1, 2 ** 63, -1, -(2 ** 63), True, False, None, 1.5, float("nan"), "text", b"bin",
            [1, 2], {"a": 1}, {"nested": [{"x": [1] * 3}]}, "x" * rng.randint(5000, 70000),
            b"\x00" * rng.randint(1, 64)]


def _valid(op: str, rng: random.Random, request_id: int, topic: str) -> dict[str, Any]:
    """A plausible request of ``op`` on a fuzz topic (never the known one)."""
    fields: dict[str, Any] = {"v": PROTOCOL_VERSION, "op": op, "id": request_id}
    body = {"body": rng.randbytes(rng.randint(1, 64)), "keys": [f"k{rng.randint(0, 9)}"], "tags": "t"}
    extras: dict[str, dict[str, Any]] = {
        "send": {"topic": topic, "messages": [body]},
        "pull": {"topic": topic, "queue_id": rng.randint(0, 3), "offset": rng.randint(0, 5), "max_wait_ms": 0},
        "query_by_key": {"topic": topic, "key": "k1"},
        "get_by_id": {"msg_id": "7F00000100002A9F" + f"{rng.randint(0, 1 << 20):016X}"},
        "create_topic": {"topic": topic, "queue_count": rng.randint(1, 8)},
        "commit_offset": {"group": f"fz-g{rng.randint(0, 50)}", "topic": topic, "queue_id": 0,
                          "offset": rng.randint(0, 100)},
        "fetch_offset": {"group": f"fz-g{rng.randint(0, 50)}", "topic": topic, "queue_id": 0},
        "queue_stats": {"topic": topic, "queue_id": 0},
        "offset_for_time": {"topic": topic, "queue_id": 0, "timestamp": rng.randint(0, 1 << 41)},
        "get_by_offset": {"commit_log_offset": rng.randint(0, 1 << 20)},
        "delete_topic": {"topic": topic},
    }
    fields.update(extras.get(op, {}))
    return fields


def _field_names(op: str) -> list[str]:
    return [f.name for f in msgspec.structs.fields(REQUEST_TYPES[op])]


def cases(rng: random.Random, count: int, config: StoreConfig, seed: int) -> Iterator[Case]:
    """``count`` single cases, drawn by ``rng``; ids start at 1 and grow."""
    ops = list(REQUEST_TYPES)
    names = bad_names(rng, seed)
    for request_id in range(1, count + 1):
        roll = rng.random()
        topic = f"fz-{rng.randint(0, 40)}"
        op = rng.choice(ops)
        if roll < 0.10:
            yield Case("garbage", [rng.randbytes(rng.randint(0, 300))], ANSWERED, 0)
        elif roll < 0.16:
            frame = _encode(_valid(op, rng, request_id, topic))
            yield Case("truncated", [frame[:rng.randint(0, max(0, len(frame) - 1))]], ANSWERED, 0)
        elif roll < 0.20:
            value = rng.choice([[1, 2], "str", 7, None, b"bin", 1.5])
            yield Case("not-a-map", [_encode(value)], ANSWERED, 0)
        elif roll < 0.45:
            request = _valid(op, rng, request_id, topic)
            field = rng.choice([*_field_names(op), "messages", "unknown_field"])
            request[field] = rng.choice(_wrong_values(rng))
            keep_id = field != "id"
            yield Case(f"wrong-type:{op}.{field}", [_encode(request)], ANSWERED, request_id if keep_id else 0)
        elif roll < 0.48:
            request = _valid(op, rng, request_id, topic)
            request[rng.choice(list(request))] = msgspec.Raw(_deep(rng.randint(200, 5000)))
            yield Case("deep-nesting", [_encode(request)], ANSWERED, 0)
        elif roll < 0.51:
            request = _valid(op, rng, request_id, topic)
            raw = {k.encode(): v for k, v in request.items()}  # bin keys, not str
            yield Case("bin-keys", [_encode(raw)], ANSWERED, 0)
        elif roll < 0.70:
            request = _valid(rng.choice(["send", "pull", "create_topic", "commit_offset", "fetch_offset",
                                         "delete_topic", "query_by_key", "queue_stats"]), rng, request_id, topic)
            name = rng.choice(names)
            target = "group" if "group" in request and rng.random() < 0.5 else "topic"
            request[target] = name
            # Reserved topic names are fine group names; every other one is refused either way.
            refused = target == "topic" or not name.startswith(("TBW", "rmq_sys_", "%RETRY%", "%DLQ%"))
            yield Case(f"bad-name:{target}", [_encode(request)], ANSWERED, request_id, refused)
        elif roll < 0.76:
            yield _oversized_content(rng, config, request_id, topic)
        elif roll < 0.82:
            request = _valid(op, rng, request_id, topic)
            key = rng.choice(["id", "v", "op", "queue_id", "offset", "max_messages", "max_bytes", "max_wait_ms"])
            request[key] = rng.choice([2 ** 64 - 1, -(2 ** 63), 2 ** 63 - 1, 0, -1])
            yield Case(f"huge-or-negative:{key}", [_encode(request)], ANSWERED,
                       request_id if key != "id" else 0)
        elif roll < 0.90:
            frame = _encode(_valid(op, rng, request_id, topic))
            shape = rng.choice(["many", "two", "empty-after", "empty-first-two"])
            frames = {"many": [frame] * rng.randint(3, 50), "two": [frame, frame], "empty-after": [frame, b""],
                      "empty-first-two": [b"", frame, frame]}[shape]
            yield Case(f"frames:{shape}", frames, IGNORED, 0)
        elif roll < 0.92:
            size = config.client_frame_bytes_max + rng.randint(1, 4096)
            yield Case("oversized-frame", [b"\x80" + b"x" * (size - 1)], DROPPED, 0)
        else:
            request = _valid(op, rng, request_id, topic)
            yield Case(f"valid:{op}", [_encode(request)], ANSWERED, request_id)


def _oversized_content(rng: random.Random, config: StoreConfig, request_id: int, topic: str) -> Case:
    """A body or properties past their limits, in a frame that still fits (an error reply, not a drop)."""
    choice = rng.choice(["body", "properties", "keys", "batch"])
    message: dict[str, Any]
    if choice == "body":
        message = {"body": b"b" * (config.message_body_bytes_max + 1)}
    elif choice == "properties":
        message = {"body": b"x", "properties": {f"p{i}": "v" * 200 for i in range(200)}}
    elif choice == "keys":
        message = {"body": b"x", "keys": ["k" * 100] * 400}
    else:
        message = {"body": b"y" * 4096}
    messages = [message] * (rng.randint(1100, 1200) if choice == "batch" else 1)
    frame = _encode({"v": PROTOCOL_VERSION, "op": "send", "id": request_id, "topic": topic, "messages": messages})
    expect = ANSWERED if len(frame) <= config.client_frame_bytes_max else DROPPED
    return Case(f"oversized:{choice}", [frame], expect, request_id)


def flood_cases(rng: random.Random, count: int, first_id: int) -> Iterator[Case]:
    """Resource floods, meant to be pipelined: topics, groups, queues, parked long polls."""
    for i in range(count):
        request_id = first_id + i
        kind = rng.choice(["topics", "groups", "queues", "long-polls"])
        if kind == "topics":
            request = {"op": "create_topic", "topic": f"fz-flood-{request_id}", "queue_count": rng.randint(1, 64)}
        elif kind == "groups":
            request = {"op": "commit_offset", "group": f"fz-flood-g{request_id}", "topic": "fz-0",
                       "queue_id": 0, "offset": request_id}
        elif kind == "queues":
            request = {"op": "create_topic", "topic": "fz-wide", "queue_count": rng.randint(1, 1024)}
        else:
            request = {"op": "pull", "topic": "fz-parked", "queue_id": 0, "offset": 0, "max_wait_ms": 500}
        yield Case(f"flood:{kind}", [_encode({"v": PROTOCOL_VERSION, "id": request_id, **request})], ANSWERED,
                   request_id)


# --- running it against a live engine ------------------------------------------------------

@dataclass
class FuzzReport:
    seed: int
    requests: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    replies: dict[str, int] = field(default_factory=dict)  # "ok" or the error name -> count
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1


def _dealer(endpoint: str, *, linger_ms: int = 0) -> zmq.Socket:
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    endpoints.allow_ipv6(sock, endpoint).connect(endpoint)
    return sock


def _judge(report: FuzzReport, case: Case, frame: bytes) -> int | None:
    """Check one reply against the protocol; its id (None if it is not a reply map)."""
    try:
        reply = msgspec.msgpack.decode(frame)
    except msgspec.DecodeError as exc:
        report.violations.append(f"{case.kind}: a reply that is not msgpack ({exc}): {frame[:80].hex()}")
        return None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool) or reply.get("v") != PROTOCOL_VERSION:
        report.violations.append(f"{case.kind}: not a reply map: {str(reply)[:200]}")
        return None
    if reply["ok"]:
        report.count(report.replies, "ok")
        if case.refused:
            report.violations.append(f"{case.kind}: accepted an invalid name: {case.frames[0][:200]!r}")
    else:
        error = reply.get("error") or {}
        code, name = error.get("code"), error.get("name")
        if not isinstance(code, int) or code not in ErrorCode._value2member_map_ \
                or ErrorCode(code).name != name or not error.get("message"):
            report.violations.append(f"{case.kind}: undocumented error {error}")
        report.count(report.replies, str(name))
    return reply.get("id") if isinstance(reply.get("id"), int) else None


def _await(sock: zmq.Socket, report: FuzzReport, case: Case, request_id: int, timeout_s: float) -> None:
    """Wait for the reply carrying ``request_id`` (any reply when it is 0)."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0 or not sock.poll(remaining_ms):
            report.violations.append(f"{case.kind}: no reply within {timeout_s:.0f} s: {case.frames[0][:120].hex()}")
            return
        got = _judge(report, case, sock.recv())
        if request_id in (0, got):
            return
        report.violations.append(f"{case.kind}: a reply with id {got} while waiting for {request_id}")


def run(endpoint: str, config: StoreConfig, *, seed: int, count: int, flood_count: int) -> FuzzReport:
    """Send ``count`` single cases one at a time, then ``flood_count`` pipelined ones; judge every reply."""
    rng = random.Random(seed)
    report = FuzzReport(seed)
    timeout_s = config.long_poll_wait_ms_max / 1000 + 10  # a fuzzed pull may wait as long as the engine lets it
    ping_id = 1 << 40
    started = time.monotonic()
    sock = _dealer(endpoint)
    try:
        for case in cases(rng, count, config, seed):
            report.requests += 1
            report.count(report.by_kind, case.kind.split(":")[0])
            if case.expect == DROPPED:  # the engine closes this connection: a socket of its own
                throwaway = _dealer(endpoint, linger_ms=5_000)
                throwaway.send_multipart(case.frames)
                throwaway.close()
                continue
            sock.send_multipart(case.frames)
            if case.expect == ANSWERED:
                _await(sock, report, case, case.request_id, timeout_s)
            else:  # nothing may come back: the next reply on this socket is the ping's
                ping_id += 1
                sock.send(_encode({"v": PROTOCOL_VERSION, "op": "ping", "id": ping_id}))
                _await(sock, report, case, ping_id, timeout_s)
        _flood(sock, report, rng, flood_count, count + 1, timeout_s)
    finally:
        sock.close()
    report.seconds = time.monotonic() - started
    return report


def _flood(sock: zmq.Socket, report: FuzzReport, rng: random.Random, count: int, first_id: int,
           timeout_s: float) -> None:
    sock.send(_encode({"v": PROTOCOL_VERSION, "op": "create_topic", "id": first_id - 1, "topic": "fz-parked",
                       "queue_count": 1}))
    _await(sock, report, Case("flood:setup", [], ANSWERED, first_id - 1), first_id - 1, timeout_s)
    outstanding: dict[int, Case] = {}
    flood = list(flood_cases(rng, count, first_id))
    deadline = time.monotonic() + timeout_s + count / 100
    sent = 0
    while sent < len(flood) or outstanding:
        while sent < len(flood) and len(outstanding) < 200:  # in flight: below the writer's and owners' queues
            case = flood[sent]
            sock.send_multipart(case.frames)
            outstanding[case.request_id] = case
            report.requests += 1
            report.count(report.by_kind, case.kind)
            sent += 1
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0 or not sock.poll(remaining_ms):
            report.violations.append(f"flood: {len(outstanding)} requests unanswered: "
                                     f"{sorted({c.kind for c in outstanding.values()})}")
            return
        frame = sock.recv()
        got = _judge(report, Case("flood", [], ANSWERED, 0), frame)
        if got not in outstanding:
            report.violations.append(f"flood: a reply with an unknown id {got}")
            continue
        del outstanding[got]


# --- what must hold afterwards ---------------------------------------------------------------

KNOWN_QUEUES = 2
PRIVATE_MIB_MAX = 256  # per actor: one frame is at most client_frame_bytes_max, queues are bounded (8.4)


def store_known(client: StoreClient) -> list[list[bytes]]:
    """Messages stored before the fuzzing, per queue of KNOWN_TOPIC: they must come through intact."""
    client.create_topic(KNOWN_TOPIC, queue_count=KNOWN_QUEUES)
    known: list[list[bytes]] = []
    for queue_id in range(KNOWN_QUEUES):
        bodies = [f"known-{queue_id}-{i}".encode() * (i + 1) for i in range(32)]
        client.send(KNOWN_TOPIC, [{"body": b, "keys": [f"known-{i}"]} for i, b in enumerate(bodies)],
                    queue_id=queue_id)
        known.append(bodies)
    return known


def after_checks(engine: EngineProcess, known: list[list[bytes]], *, search_dirs: list[Path]) -> list[str]:
    """No restart, bounded memory, no file made outside the store, the known messages intact."""
    problems = []
    status = control(engine.store_dir, StatusQuery())
    problems += [f"actor {a.name} restarted {a.restarts} times" for a in status.actors if a.restarts]
    problems += [f"actor {a.name} is {a.lifecycle}" for a in status.actors if a.lifecycle != "RUNNING"]
    for name, pid in engine.actor_pids().items():
        try:
            memory = psutil.Process(pid).memory_info()
        except psutil.Error:
            continue
        if (memory.rss - memory.shared) >> 20 > PRIVATE_MIB_MAX:
            problems.append(f"actor {name} holds {(memory.rss - memory.shared) >> 20} MiB of private memory")
    for directory in search_dirs:
        for root, dirs, files in _walk(directory, depth_max=6):
            problems += [f"a file made from a fuzzed name: {Path(root) / n}" for n in [*dirs, *files]
                         if ESCAPE_MARK in n]
    with engine.client() as client:
        for queue_id, bodies in enumerate(known):
            reply = client.pull(KNOWN_TOPIC, queue_id, 0, max_messages=len(bodies))
            got = [m["body"] for m in reply["messages"]]
            if got != bodies:
                problems.append(f"{KNOWN_TOPIC}/{queue_id}: {len(got)} messages read back, not the "
                                f"{len(bodies)} stored before the fuzzing, or changed")
    return problems


def _walk(directory: Path, *, depth_max: int) -> Iterator[tuple[str, list[str], list[str]]]:
    base = len(directory.parts)
    for root, dirs, files in os.walk(directory):
        yield root, dirs, files
        if len(Path(root).parts) - base >= depth_max:
            dirs.clear()
