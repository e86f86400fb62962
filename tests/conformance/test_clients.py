"""One scenario through the Python, C and Node clients against a live engine (clients/conformance.md).

Each client sends its own known set of messages (keys, tags and properties
in non-ASCII text, binary bodies); then every client pulls, queries and
gets by id what all of them sent, and the three answers must agree field
for field and match what was sent. Errors must carry the same codes.
Delayed and transactional sends go through every client too: a delayed message
reaches its queue at its time and not before, and a half message only once
committed. The CURVE test runs the scenario again on an engine with an allow-list,
where an unknown key and a plaintext client get no service.

Hand-built bad frames (bin keys, wrong types, unknown ops, oversized frames)
are sent byte by byte in ``tests/integration/test_bad_input.py``.

The drivers are built by ``make clients`` (part of ``make test``); a missing
driver skips these tests, and fails them in CI (``tests.helpers.require``).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.config import StoreConfig
from engine.ipc.curve import CurveKeys, keygen
from supervisor.launcher import EngineProcess
from tests.helpers import engine_with_topics, require, wait_dispatched

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
DRIVERS = {
    "python": [sys.executable, str(ROOT / "clients" / "python" / "conformance.py")],
    "c": [str(ROOT / "clients" / "c" / "build" / "rmq_conformance")],
    "node": ["node", str(ROOT / "clients" / "node" / "conformance.mjs")],
}
TOPIC = "conformance"
TIMED_TOPIC = "conformance-timed"  # one queue per client
TX_TOPIC = "conformance-tx"  # one queue per client
ALL_BYTES = bytes(range(256))
DELAY_MS = 1_000
DELAY_LEVEL_1_MS = 1_000  # RocketMQ 4's first level (StoreConfig.delay_levels_ms)
NO_SUCH_HALF = "7F00000100002A9F0000000000000000"  # a well-formed id whose record is not a half message


def require_drivers() -> None:
    missing = []
    if not Path(DRIVERS["c"][0]).is_file():
        missing.append(f"{DRIVERS['c'][0]} (make clients)")
    if shutil.which("node") is None or not (ROOT / "clients" / "node" / "node_modules" / "zeromq").is_dir():
        missing.append("node and clients/node/node_modules (make clients)")
    require(not missing, "; ".join(missing))


def drive(client: str, endpoint: str, commands: list[dict[str, Any]], *, curve: CurveKeys | None = None,
          timeout_ms: int = 5000) -> list[dict[str, Any]]:
    argv = [*DRIVERS[client], endpoint, "--timeout-ms", str(timeout_ms)]
    if curve is not None:
        argv += ["--server-key", curve.server_public_key, "--public-key", curve.public_key,
                 "--secret-key", curve.secret_key]
    done = subprocess.run(argv, input=json.dumps(commands).encode(), capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, f"{client} driver failed ({done.returncode}): {done.stderr.decode()}"
    results = json.loads(done.stdout)
    assert len(results) == len(commands), f"{client}: {len(results)} results for {len(commands)} commands"
    return results


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def messages_of(client: str) -> list[dict[str, Any]]:
    """What ``client`` sends: text in several scripts, binary bodies, and every optional field."""
    return [
        {"body_b64": b64(f"plain text from {client}".encode()), "keys": [f"{client}-k1"], "tags": "TagA"},
        {"body_b64": b64(ALL_BYTES), "keys": [f"{client}-bin", f"{client}-bin2"], "tags": "bin\u00e4r",
         "properties": {"region": "eu-west", "note": "caf\u00e9 \u2615 \u65e5\u672c\u8a9e"}},
        {"body_b64": b64(b"\x00\x00\x00zero"), "keys": [f"{client}-\u5bc6\u94a5"], "tags": "\u6807\u7b7e"},
        {"body_b64": b64("\u041f\u0440\u0438\u0432\u0435\u0442 \U0001f600".encode()),
         "properties": {"\u00e9t\u00e9": "\u00fc\u00f1\u00ee\u00e7\u00f8d\u00e9"}},
    ]


def send_commands(client: str) -> list[dict[str, Any]]:
    one, two, three, four = messages_of(client)
    return [
        {"op": "send", "topic": TOPIC, "queue_id": 0, "messages": [one]},
        {"op": "send", "topic": TOPIC, "queue_id": 1, "messages": [two, three, four]},
    ]


def pull_commands() -> list[dict[str, Any]]:
    return [{"op": "pull", "topic": TOPIC, "queue_id": q, "offset": 0, "max_messages": 64} for q in (0, 1)]


def error_commands() -> list[dict[str, Any]]:
    return [
        {"op": "pull", "topic": "no-such-topic", "queue_id": 0, "offset": 0},
        {"op": "pull", "topic": TOPIC, "queue_id": 99, "offset": 0},
        {"op": "pull", "topic": "bad topic!", "queue_id": 0, "offset": 0},
        {"op": "get_by_id", "msg_id": "NOT-AN-ID"},
        {"op": "send", "topic": TOPIC, "messages": [{"body_b64": ""}]},
        {"op": "send", "topic": TOPIC, "messages": [{"body_b64": b64(b"x"), "keys": ["has space"]}]},
        {"op": "fetch_offset", "group": "g", "topic": TOPIC, "queue_id": 42},
        {"op": "send", "topic": TOPIC, "delay_ms": 4 * 86_400_000, "messages": [{"body_b64": b64(b"x")}]},
        {"op": "send", "topic": TOPIC, "transaction": True, "messages": [{"body_b64": b64(b"x")}]},
        {"op": "end_transaction", "msg_id": NO_SUCH_HALF, "decision": "commit"},
    ]
EXPECTED_ERRORS = ["TOPIC_NOT_FOUND", "QUEUE_NOT_FOUND", "INVALID_TOPIC", "INVALID_MSG_ID", "MESSAGE_ILLEGAL",
                   "INVALID_PROPERTY", "QUEUE_NOT_FOUND", "DELAY_ILLEGAL", "INVALID_FIELD", "TRANSACTION_NOT_FOUND"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    require_drivers()
    # Half messages undecided for a second are offered to transaction_checks (6 s by default).
    config = StoreConfig.test_min().replace(transaction_timeout_ms=1_000)
    with engine_with_topics(tmp_path_factory.mktemp("conformance") / "store", config,
                            {TOPIC: 2, TIMED_TOPIC: len(DRIVERS), TX_TOPIC: len(DRIVERS)}) as process:
        yield process


def sent_by_everyone(endpoint: str, curve: dict[str, CurveKeys | None] | None = None) -> dict[str, list]:
    """Every client sends its set; returns the send results by client."""
    results = {}
    for client in DRIVERS:
        replies = drive(client, endpoint, send_commands(client), curve=(curve or {}).get(client))
        assert all(r["ok"] for r in replies), (client, replies)
        results[client] = [result for reply in replies for result in reply["results"]]
        assert [r["status"] for r in results[client]] == ["PUT_OK"] * 4
    return results


def agree(answers: dict[str, Any], what: str) -> Any:
    """All clients' answers are equal; return it."""
    reference = answers["python"]
    for client, answer in answers.items():
        assert answer == reference, f"{what}: {client} differs from python:\n{answer}\n{reference}"
    return reference


def check_messages_match_what_was_sent(pulled: list[dict[str, Any]]) -> None:
    by_body = {(m["body_b64"], tuple(m["keys"])): m for m in pulled}
    for client in DRIVERS:
        for sent in messages_of(client):
            found = by_body[(sent["body_b64"], tuple(sent.get("keys", [])))]
            assert found["tags"] == sent.get("tags")
            user_properties = {k: v for k, v in found["properties"].items() if k != "UNIQ_KEY"}
            assert user_properties == sent.get("properties", {})
            assert found["topic"] == TOPIC and len(found["msg_id"]) == 32


def test_every_client_reads_what_every_client_wrote_field_for_field(engine: EngineProcess) -> None:
    sent = sent_by_everyone(engine.endpoint)
    pulls = agree({c: drive(c, engine.endpoint, pull_commands()) for c in DRIVERS}, "pull")
    assert all(p["ok"] and p["status"] == "FOUND" for p in pulls)
    pulled = pulls[0]["messages"] + pulls[1]["messages"]
    assert len(pulled) == 12
    check_messages_match_what_was_sent(pulled)

    ids = [r["msg_id"] for results in sent.values() for r in results]
    keys = [k for c in DRIVERS for m in messages_of(c) for k in m.get("keys", [])]
    lookups = [{"op": "get_by_id", "msg_id": i} for i in ids] + \
              [{"op": "query_by_key", "topic": TOPIC, "key": k} for k in keys]
    answers = agree({c: drive(c, engine.endpoint, lookups) for c in DRIVERS}, "lookups")
    by_id = {m["msg_id"]: m for m in pulled}
    for msg_id, answer in zip(ids, answers, strict=False):
        assert answer["ok"] and answer["message"] == by_id[msg_id]
    for key, answer in zip(keys, answers[len(ids):], strict=True):
        assert answer["ok"] and [key in m["keys"] for m in answer["messages"]] == [True], (key, answer)


def test_consumer_offsets_committed_by_one_client_are_read_by_all(engine: EngineProcess) -> None:
    for n, client in enumerate(DRIVERS):
        [reply] = drive(client, engine.endpoint, [{"op": "commit_offset", "group": f"group-{client}",
                                                    "topic": TOPIC, "queue_id": 1, "offset": 100 + n}])
        assert reply == {"ok": True}
    fetches = [{"op": "fetch_offset", "group": f"group-{c}", "topic": TOPIC, "queue_id": 1} for c in DRIVERS]
    fetches.append({"op": "fetch_offset", "group": "never-committed", "topic": TOPIC, "queue_id": 0})
    answers = agree({c: drive(c, engine.endpoint, fetches) for c in DRIVERS}, "fetch_offset")
    assert [a["offset"] for a in answers] == [100, 101, 102, -1]


def test_refused_requests_carry_the_same_codes_through_every_client(engine: EngineProcess) -> None:
    answers = {}
    for client in DRIVERS:
        replies = drive(client, engine.endpoint, error_commands())
        assert all(not r["ok"] for r in replies), (client, replies)
        answers[client] = [(r["code"], r["name"]) for r in replies]
    assert [name for _code, name in agree(answers, "errors")] == EXPECTED_ERRORS


def test_pop_ack_nack_and_stats_agree_through_every_client(engine: EngineProcess) -> None:
    """Each client runs one pop group over the same three messages: pop, ack two, nack one,
    see it again with attempt 2, have its stale handle refused, ack it, read the stats."""
    topic = "conformance-pop"
    with engine.client() as client:
        client.create_topic(topic, queue_count=1)
        client.send(topic, [{"body": b"job-%d" % n, "tags": "jobs"} for n in range(3)])
        wait_dispatched(client)
    answers = {}
    for client in DRIVERS:
        group = f"workers-{client}"
        [first] = drive(client, engine.endpoint, [{"op": "pop", "group": group, "topic": topic, "queue_id": 0,
                                                   "max_messages": 3, "invisible_ms": 60_000}])
        assert first["ok"] and len(first["messages"]) == 3, (client, first)
        handles = [r["receipt_handle"] for r in first["receipts"]]
        acked, nacked = drive(client, engine.endpoint, [
            {"op": "ack", "group": group, "topic": topic, "queue_id": 0, "receipt_handles": handles[:2]},
            {"op": "change_invisible", "group": group, "topic": topic, "queue_id": 0,
             "receipt_handle": handles[2], "invisible_ms": 0}])
        assert nacked["ok"] and nacked["receipt_handle"] != handles[2], (client, nacked)
        [again] = drive(client, engine.endpoint, [{"op": "pop", "group": group, "topic": topic, "queue_id": 0,
                                                   "max_messages": 3, "max_wait_ms": 5_000}])
        stale, last, stats, conflict = drive(client, engine.endpoint, [
            {"op": "ack", "group": group, "topic": topic, "queue_id": 0, "receipt_handles": handles[2:]},
            {"op": "ack", "group": group, "topic": topic, "queue_id": 0,
             "receipt_handles": [r["receipt_handle"] for r in again["receipts"]]},
            {"op": "pop_stats", "group": group, "topic": topic, "queue_id": 0},
            {"op": "commit_offset", "group": group, "topic": topic, "queue_id": 0, "offset": 0}])
        answers[client] = {
            "bodies": [base64.b64decode(m["body_b64"]) for m in first["messages"]],
            "attempts": [r["attempt"] for r in first["receipts"]] + [r["attempt"] for r in again["receipts"]],
            "again": [base64.b64decode(m["body_b64"]) for m in again["messages"]],
            "acks": [(acked["acked"], acked["refused"]), (stale["acked"], stale["refused"]),
                     (last["acked"], last["refused"])],
            "stats": {k: v for k, v in stats.items() if k != "ok"},
            "conflict": (conflict["ok"], conflict.get("name")),
        }
    answer = agree(answers, "pop")
    assert answer["bodies"] == [b"job-0", b"job-1", b"job-2"] and answer["again"] == [b"job-2"]
    assert answer["attempts"] == [1, 1, 1, 2]
    assert answer["acks"] == [(2, [0, 0]), (0, [22]), (1, [0])]
    assert (answer["stats"]["ack_floor"], answer["stats"]["in_flight"], answer["stats"]["redelivered"]) == (3, 0, 1)
    assert answer["conflict"] == (False, "GROUP_MODE_CONFLICT")


def pull_command(topic: str, queue_id: int, offset: int, **fields: Any) -> dict[str, Any]:
    return {"op": "pull", "topic": topic, "queue_id": queue_id, "offset": offset, **fields}


def test_delayed_messages_reach_their_queue_at_their_time_through_every_client(engine: EngineProcess) -> None:
    """Each client, on its own queue: a send with delay_ms and one with delay_level 1 are stored
    at once and not visible; long-polling pulls wake as each is delivered, no earlier than its
    time. A deliver_at_ms already past is stored for consumers at once."""
    answers = {}
    for queue_id, client in enumerate(DRIVERS):
        def send(body: bytes, queue_id: int = queue_id, **timing: int) -> dict[str, Any]:
            message = {"body_b64": b64(body), "keys": ["later-key"], "tags": "later", "properties": {"app": "timed"}}
            return {"op": "send", "topic": TIMED_TOPIC, "queue_id": queue_id, **timing, "messages": [message]}

        by_ms, by_level, hidden, first, second, past, third = drive(client, engine.endpoint, [
            send(b"by delay_ms", delay_ms=DELAY_MS),
            send(b"by delay_level", delay_level=1),
            pull_command(TIMED_TOPIC, queue_id, 0),
            pull_command(TIMED_TOPIC, queue_id, 0, max_messages=1, max_wait_ms=10_000),
            pull_command(TIMED_TOPIC, queue_id, 1, max_messages=1, max_wait_ms=10_000),
            send(b"by deliver_at_ms", deliver_at_ms=1),
            pull_command(TIMED_TOPIC, queue_id, 2, max_wait_ms=10_000)])
        assert all(r["ok"] for r in (by_ms, by_level, hidden, first, second, past, third)), (client, by_ms, by_level)
        delivered = {base64.b64decode(m["body_b64"]): m for m in first["messages"] + second["messages"]}
        sent = {b"by delay_ms": (by_ms["results"][0], DELAY_MS),
                b"by delay_level": (by_level["results"][0], DELAY_LEVEL_1_MS)}
        answers[client] = {
            "sent": [result["status"] for reply in (by_ms, by_level, past) for result in reply["results"]],
            "hidden": (hidden["status"], hidden["messages"]),
            "delivered": {body: (m["topic"], m["queue_id"] - queue_id, m["tags"], m["keys"],
                                 {k: v for k, v in m["properties"].items()
                                  if k not in ("UNIQ_KEY", "ORIGIN_OFFSET", "TIMER_DELIVER_MS")})
                          for body, m in delivered.items()},
            # stored in its queue no earlier than its time (the send's store time plus its wait)
            "on_time": {body: delivered[body]["store_timestamp"] - result["store_timestamp"] >= wait
                        for body, (result, wait) in sent.items() if body in delivered},
            "at_once": (past["results"][0]["queue_id"] - queue_id, past["results"][0]["queue_offset"],
                        [base64.b64decode(m["body_b64"]) for m in third["messages"]]),
        }
    answer = agree(answers, "delays")
    assert answer["sent"] == ["PUT_OK"] * 3
    assert answer["hidden"] == ("NO_MESSAGE_IN_QUEUE", [])
    user = {"app": "timed"}
    assert answer["delivered"] == {b"by delay_ms": (TIMED_TOPIC, 0, "later", ["later-key"], user),
                                   b"by delay_level": (TIMED_TOPIC, 0, "later", ["later-key"], {**user, "DELAY": "1"})}
    assert answer["on_time"] == {b"by delay_ms": True, b"by delay_level": True}
    assert answer["at_once"] == (0, 2, [b"by deliver_at_ms"])


def test_transactional_messages_are_seen_only_once_committed_through_every_client(engine: EngineProcess) -> None:
    """Each client, on its own queue: three half messages are invisible; one is committed and
    appears, one is rolled back and cannot be committed after (TRANSACTION_ENDED), and the third,
    left undecided, is offered to the producer group's transaction_checks, then committed."""
    answers = {}
    for queue_id, client in enumerate(DRIVERS):
        group = f"producers-{client}"

        def send(body: bytes, group: str = group, queue_id: int = queue_id) -> dict[str, Any]:
            return {"op": "send", "topic": TX_TOPIC, "queue_id": queue_id, "transaction": True,
                    "producer_group": group, "messages": [{"body_b64": b64(body), "tags": "tx", "keys": ["tx-key"]}]}

        def end(msg_id: str, decision: str, **fields: str) -> dict[str, Any]:
            return {"op": "end_transaction", "msg_id": msg_id, "decision": decision, **fields}

        *halves, hidden = drive(client, engine.endpoint, [send(b"commit me"), send(b"roll me back"), send(b"ask me"),
                                                          pull_command(TX_TOPIC, queue_id, 0)])
        assert all(h["ok"] for h in halves), (client, halves)
        to_commit, to_roll_back, to_ask = (h["results"][0]["msg_id"] for h in halves)
        replies = drive(client, engine.endpoint, [
            end(to_commit, "commit"),
            pull_command(TX_TOPIC, queue_id, 0, max_wait_ms=10_000),
            end(to_roll_back, "rollback", producer_group=group),
            end(to_roll_back, "commit"),
            end(to_commit, "commit"),
            end(to_commit, "rollback"),
            end(to_commit, "commit", producer_group="someone-else"),
            {"op": "transaction_checks", "producer_group": group, "max_wait_ms": 10_000},
            end(to_ask, "commit", producer_group=group),
            pull_command(TX_TOPIC, queue_id, 1, max_wait_ms=10_000)])
        committed, visible, rolled_back, late_commit, again, other_way, foreign, checks, answered, last = replies

        def seen(messages: list[dict[str, Any]], queue_id: int = queue_id) -> list[tuple]:
            return [(base64.b64decode(m["body_b64"]), m["topic"], m["queue_id"] - queue_id, m["tags"], m["keys"])
                    for m in messages]

        answers[client] = {
            "sent": [h["results"][0]["status"] for h in halves],
            "hidden": (hidden["status"], hidden["messages"]),
            "decisions": [(r["ok"], r.get("decision"), r.get("name")) for r in
                          (committed, rolled_back, late_commit, again, other_way, foreign, answered)],
            "visible": seen(visible["messages"]),
            "checks": seen(checks.get("checks", [])),
            "check_times": [c["check_times"] for c in checks.get("checks", [])],
            "checked_ids": [c["msg_id"] for c in checks.get("checks", [])] == [to_ask],
            "last": seen(last["messages"]),
        }
    answer = agree(answers, "transactions")
    assert answer["sent"] == ["PUT_OK"] * 3
    assert answer["hidden"] == ("NO_MESSAGE_IN_QUEUE", [])
    assert answer["decisions"] == [(True, "commit", None), (True, "rollback", None), (False, None, "TRANSACTION_ENDED"),
                                   (True, "commit", None), (False, None, "TRANSACTION_ENDED"),
                                   (False, None, "TRANSACTION_NOT_FOUND"), (True, "commit", None)]
    assert answer["visible"] == [(b"commit me", TX_TOPIC, 0, "tx", ["tx-key"])]
    assert answer["checks"] == [(b"ask me", TX_TOPIC, 0, "tx", ["tx-key"])]  # where a commit puts it
    assert answer["check_times"] == [1] and answer["checked_ids"]
    assert answer["last"] == [(b"ask me", TX_TOPIC, 0, "tx", ["tx-key"])]  # the rolled-back one never came


@pytest.fixture
def curve_engine(tmp_path: Path) -> Iterator[tuple[EngineProcess, dict[str, CurveKeys], CurveKeys]]:
    require_drivers()
    keys = tmp_path / "keys"
    server_public, server_secret = keygen(keys / "server", "server")
    allowed = {client: CurveKeys.from_files(server_public, keygen(keys / "allowed", client)[1]) for client in DRIVERS}
    _public, stranger_secret = keygen(keys / "strangers", "stranger")
    stranger = CurveKeys.from_files(server_public, stranger_secret)
    config = StoreConfig.test_min().replace(curve_enabled=True, curve_server_secret_key_file=str(server_secret),
                                            curve_authorized_keys_dir=str(keys / "allowed"))
    process = EngineProcess(tmp_path / "store", config=config)
    process.start()
    try:
        yield process, allowed, stranger
    finally:
        process.stop()


def test_curve_serves_allowed_keys_and_nobody_else(curve_engine) -> None:
    engine, allowed, stranger = curve_engine
    sent_by_everyone(engine.endpoint, allowed)
    pulls = agree({c: drive(c, engine.endpoint, pull_commands(), curve=allowed[c]) for c in DRIVERS}, "pull")
    check_messages_match_what_was_sent(pulls[0]["messages"] + pulls[1]["messages"])
    for client in DRIVERS:
        for keys in (stranger, None):  # a key not on the allow-list, and no CURVE at all
            [reply] = drive(client, engine.endpoint, [{"op": "ping"}], curve=keys, timeout_ms=700)
            assert (reply["ok"], reply["code"], reply["name"]) == (False, -1, "TIMEOUT"), (client, keys, reply)


def test_an_oversized_send_is_refused_at_once_by_every_client_naming_the_limit(engine: EngineProcess) -> None:
    """The engine drops a frame past client_frame_bytes_max without a reply (docs/protocol.md 1.5):
    each client refuses it before sending, with the code of a body too large, MESSAGE_ILLEGAL."""
    oversized = [{"op": "send", "topic": TOPIC, "messages": [{"body_b64": b64(b"x" * 5_000_000)}]},
                 {"op": "ping"}]
    for client in DRIVERS:
        started = time.monotonic()
        refused, pong = drive(client, engine.endpoint, oversized, timeout_ms=10_000)
        assert (refused["ok"], refused["code"], refused["name"]) == (False, 8, "MESSAGE_ILLEGAL"), (client, refused)
        assert "4259840" in refused["message"].replace(",", "").replace(" ", ""), (client, refused["message"])
        assert pong["ok"], (client, pong)
        assert time.monotonic() - started < 8.0, f"{client}: waited for a reply that cannot come"
