"""The command line as a new user meets it in the first hour: every path ends in one clear line
and a documented exit code (docs/client.md, "Exit codes of rmqpy"), never a traceback, a
silent success that hides a failure, or a wait for the whole deadline."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.cli import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NO_ENGINE, EXIT_OS_ERROR, EXIT_USAGE
from engine.client import FRAME_BYTES_MAX
from supervisor.launcher import EngineProcess, free_port
from tests.helpers import parked_requests, wait_dispatched

pytestmark = pytest.mark.timeout(60)

CLI = [sys.executable, "-m", "engine"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=50, check=False)


def ok(*args: str) -> subprocess.CompletedProcess[str]:
    result = run(*args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def one_line(text: str) -> str:
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def until(condition: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_consume_past_the_end_of_a_queue_says_so_with_the_valid_range(engine: EngineProcess) -> None:
    ep = ["--endpoint", engine.endpoint]
    ok("produce", *ep, "--topic", "t", "--queue-id", "0", "--count", "3", "--batch-size", "3")
    result = run("consume", *ep, "--topic", "t", "--queue-id", "0", "--offset", "999999")
    assert result.returncode == EXIT_FAILED
    assert "OFFSET_OVERFLOW_BADLY" in one_line(result.stderr) and "0..3" in result.stderr


def test_produce_to_an_unknown_topic_says_it_created_it(engine: EngineProcess) -> None:
    ep = ["--endpoint", engine.endpoint]
    first = ok("produce", *ep, "--topic", "typo", "--body", "a")
    assert one_line(first.stderr) == "created topic typo with 4 queues (auto-create)"
    assert ok("produce", *ep, "--topic", "typo", "--body", "b").stderr == ""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bad", [["--count", "-5"], ["--count", "0"], ["--batch-size", "0"], ["--body-size", "0"],
                                 ["--queue-id", "-1"], ["--timeout-ms", "0"]])
def test_bad_numbers_are_usage_errors_before_anything_is_sent(bad: list[str]) -> None:
    result = run("produce", "--endpoint", f"tcp://127.0.0.1:{free_port()}", "--topic", "t", *bad)
    assert result.returncode == EXIT_USAGE
    assert f"argument {bad[0]}" in result.stderr and ("positive" in result.stderr or "negative" in result.stderr)


# Each a number past what its field takes on the wire (engine/ipc/protocol.py: a queue id is an Int32,
# an offset or a time an Int64) or past what the client can wait (one ZeroMQ poll's C int): the
# last line of stderr names the option and its bound.
TOO_LARGE = [
    (["consume", "--topic", "t", "--since-ms", "99999999999999999999"], "at most 9223372036854775807"),
    (["consume", "--topic", "t", "--offset", str(2**63)], "at most 9223372036854775807"),
    (["consume", "--topic", "t", "--queue-id", str(2**31)], "at most 2147483647"),
    (["consume", "--topic", "t", "--wait-ms", str(2**31)], "at most 1073741823 ms"),
    (["consume", "--topic", "t", "--pop", "--group", "g", "--invisible-ms", str(2**64)], "at most 9223372036854775807"),
    (["produce", "--topic", "t", "--queue-id", str(2**31)], "at most 2147483647"),
    (["produce", "--topic", "t", "--delay-ms", str(2**64)], "at most 9223372036854775807"),
    (["produce", "--topic", "t", "--deliver-at", str(2**64)], "at most 9223372036854775807"),
    (["query", "--offset", str(2**64)], "at most 9223372036854775807"),
    (["query", "--topic", "t", "--key", "k", "--end", str(2**64)], "at most 9223372036854775807"),
    (["stats", "--timeout-ms", str(2**31)], "at most 1073741823 ms"),
    (["transaction", "--checks", "--wait-ms", str(2**63)], "at most 1073741823 ms"),
]


def test_numbers_too_large_for_the_wire_are_usage_errors_naming_the_bound(engine: EngineProcess) -> None:
    """Against a live engine, so that a number the parser let through would reach msgpack (an
    OverflowError's traceback) or the engine (a refusal, status 1)."""
    ok("produce", "--endpoint", engine.endpoint, "--topic", "t", "--body", "b")
    for args, bound in TOO_LARGE:
        result = run(*args, "--endpoint", engine.endpoint)
        assert "Traceback" not in result.stderr, (args, result.stderr)
        assert result.returncode == EXIT_USAGE, (args, result.returncode, result.stderr)
        last = result.stderr.strip().splitlines()[-1]
        assert f"argument {args[-2]}: {args[-1]} is too large ({bound}" in last, (args, last)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("endpoint", ["foo", "tcp://127.0.0.1"])
def test_an_endpoint_zeromq_cannot_read_is_a_usage_error(endpoint: str) -> None:
    result = run("topics", "--endpoint", endpoint)
    assert result.returncode == EXIT_USAGE
    assert one_line(result.stderr).startswith(f"error: --endpoint {endpoint!r}: ")


@pytest.mark.timeout(30)
def test_half_a_curve_key_pair_is_a_usage_error(tmp_path: Path) -> None:
    result = run("topics", "--endpoint", f"tcp://127.0.0.1:{free_port()}", "--server-key", str(tmp_path / "s.key"))
    assert result.returncode == EXIT_USAGE
    assert one_line(result.stderr) == "error: CURVE needs both --server-key and --client-key"


def test_stats_counts_the_topics_that_topics_lists_and_shows_singulars(engine: EngineProcess) -> None:
    ep = ["--endpoint", engine.endpoint]
    ok("produce", *ep, "--topic", "only", "--body", "plain", "--queue-id", "1")
    listed = json.loads(ok("topics", *ep, "--json").stdout)
    stats = json.loads(ok("stats", *ep, "--json").stdout)
    assert stats["topics"] == len(listed) == 1 and stats["system_topics"] >= 3
    assert ok("stats", *ep).stdout.startswith(f"1 topic (+{stats['system_topics']} system), log ")
    with engine.client() as client:
        wait_dispatched(client)
    text = ok("consume", *ep, "--topic", "only", "--queue-id", "1").stdout
    line, summary = text.strip().splitlines()
    assert summary == "1 message"
    assert "tags=" not in line and "keys=" not in line and "None" not in line, line


def test_delayed_and_transactional_sends_print_what_a_consumer_will_get(engine: EngineProcess) -> None:
    ep = ["--endpoint", engine.endpoint]
    before_ms = int(time.time() * 1000)
    [delayed] = json.loads(ok("produce", *ep, "--topic", "later", "--body", "d", "--delay-ms", "60000",
                              "--json").stdout)["results"]
    assert delayed["topic"] == "later" and 0 <= delayed["queue_id"] < 4 and delayed["uniq_key"]
    assert before_ms + 60_000 <= delayed["deliver_at_ms"] <= int(time.time() * 1000) + 60_000
    assert delayed["waiting_in"].startswith("rmq_sys_wheel_timer/0@")
    text = ok("produce", *ep, "--topic", "later", "--body", "d", "--delay-ms", "60000").stdout
    assert re.search(r"^PUT_OK later/\d uniq_key=\w{32} due 20\d\d-\S+Z \(in (59|60)\.\d s\); waiting as "
                     r"rmq_sys_wheel_timer/0@1 id=\w{32}$", text, re.MULTILINE), text

    [half] = json.loads(ok("produce", *ep, "--topic", "paid", "--body", "h", "--transaction",
                           "--json").stdout)["results"]
    assert half["topic"] == "paid" and half["visible"] == "when committed"
    assert half["waiting_in"].startswith("RMQ_SYS_TRANS_HALF_TOPIC/0@")
    text = ok("produce", *ep, "--topic", "paid", "--body", "h2", "--transaction").stdout
    assert re.search(r"^PUT_OK paid/\d uniq_key=(\w{32}) invisible until committed: `transaction --commit (\w{32})`; "
                     r"waiting as RMQ_SYS_TRANS_HALF_TOPIC/0@1 id=\2$", text, re.MULTILINE), text
    [waiting] = json.loads(ok("query", *ep, "--topic", "paid", "--id", half["uniq_key"], "--json").stdout)
    assert waiting["topic"] == "RMQ_SYS_TRANS_HALF_TOPIC" and waiting["msg_id"] == half["msg_id"]
    assert "waiting for paid/" in ok("query", *ep, "--id", half["msg_id"]).stdout
    ok("transaction", *ep, "--commit", half["msg_id"])
    [delivered] = json.loads(ok("consume", *ep, "--topic", "paid", "--queue-id", str(half["queue_id"]),
                                "--wait-ms", "5000", "--json").stdout)
    assert delivered["uniq_key"] == half["uniq_key"] and delivered["topic"] == "paid"
    [found] = json.loads(ok("query", *ep, "--topic", "paid", "--id", half["uniq_key"], "--json").stdout)
    assert found["topic"] == "paid" and found["msg_id"] == delivered["msg_id"]
    missing = run("query", *ep, "--topic", "paid", "--id", "0" * 32)
    assert missing.returncode == EXIT_FAILED and "no message has the id" in one_line(missing.stderr)


@pytest.mark.timeout(30)
def test_every_online_command_says_at_once_that_no_engine_answers() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    commands = [["produce", "--topic", "t"], ["consume", "--topic", "t"], ["query", "--id", "X"], ["stats"],
                ["topics"], ["transaction", "--commit", "X"]]
    started = time.monotonic()
    runs = [subprocess.Popen([*CLI, *c, "--endpoint", endpoint], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for c in commands]
    for command, process in zip(commands, runs, strict=True):
        out, err = process.communicate(timeout=25)
        assert process.returncode == EXIT_NO_ENGINE, (command, out, err)
        assert one_line(err) == (f"error: no engine answers on {endpoint} (is it running? "
                                 f"`rmqpy-server status`)"), command
    assert time.monotonic() - started < 8.0  # six at once, about 1 s of waiting each (the deadline is 10 s)


def test_an_oversized_message_is_refused_at_once_naming_the_limit(engine: EngineProcess) -> None:
    started = time.monotonic()
    result = run("produce", "--endpoint", engine.endpoint, "--topic", "big", "--body-size", "5000000")
    assert result.returncode == EXIT_FAILED
    line = one_line(result.stderr)
    assert "MESSAGE_ILLEGAL (8)" in line and f"{FRAME_BYTES_MAX:,}" in line
    assert time.monotonic() - started < 8.0  # not the 10 s deadline


@pytest.mark.timeout(30)
def test_offline_commands_on_an_unusable_directory_end_in_one_line(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("x")
    for command in (["inspect", "--store-dir", str(not_a_directory)],
                    ["check", "--repair", "--store-dir", str(not_a_directory)],
                    ["keygen", "--dir", str(not_a_directory / "keys"), "--name", "server"]):
        result = run(*command)
        assert result.returncode == EXIT_OS_ERROR, (command, result.stdout, result.stderr)
        assert re.search("not a directory", one_line(result.stderr), re.IGNORECASE), result.stderr


def test_a_closed_pipe_ends_quietly(engine: EngineProcess) -> None:
    ep = ["--endpoint", engine.endpoint]
    ok("produce", *ep, "--topic", "many", "--queue-id", "0", "--count", "3000", "--batch-size", "1000",
       "--body-size", "100")
    with engine.client() as client:
        wait_dispatched(client)
    consume = subprocess.Popen([*CLI, "consume", *ep, "--topic", "many", "--count", "3000"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert consume.stdout is not None and consume.stderr is not None
    consume.stdout.readline()
    consume.stdout.close()  # as `| head -1` does
    err = consume.stderr.read().decode()
    assert consume.wait(timeout=30) == EXIT_BROKEN_PIPE
    assert err == ""


def test_ctrl_c_during_produce_prints_what_was_acknowledged(engine: EngineProcess) -> None:
    # Ctrl-C as a terminal gives it, even when this run was started in the background: a shell
    # starts background jobs with SIGINT ignored, which a child inherits (a handler it does not)
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        produce = subprocess.Popen([*CLI, "produce", "--endpoint", engine.endpoint, "--topic", "stream",
                                    "--queue-id", "0", "--count", "10000000", "--batch-size", "10"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, ignored)
    with engine.client() as client:
        until(lambda: client.list_topics() and client.queue_stats("stream", 0)["max_offset"] >= 20)
    produce.send_signal(signal.SIGINT)
    try:
        out, err = produce.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        produce.send_signal(signal.SIGUSR1)  # the CLI prints every thread's stack: where it hangs
        try:
            _out, err = produce.communicate(timeout=5)
        except subprocess.TimeoutExpired as still:  # printed its stacks, still running: what it printed
            err = still.stderr.decode(errors="replace") if isinstance(still.stderr, bytes) else "(no stack)"
        produce.kill()
        produce.wait()
        pytest.fail(f"produce did not stop within 30 s of SIGINT; its stacks:\n{err[-6000:]}")
    assert produce.returncode == EXIT_INTERRUPTED, (out, err)
    assert "Traceback" not in err
    last = out.strip().splitlines()[-1]
    assert last.startswith("interrupted: sent ") and " messages in " in last
    sent = int(last.split()[2])
    assert sent >= 20
    with engine.client() as client:  # every acknowledged message reaches its queue (dispatch follows the log)
        until(lambda: client.queue_stats("stream", 0)["max_offset"] >= sent)


def test_a_group_consume_waits_on_all_queues_at_once(engine: EngineProcess) -> None:
    ep = ["--endpoint", engine.endpoint]
    with engine.client() as client:
        client.create_topic("quiet", queue_count=4)
        started = time.monotonic()
        empty = run("consume", *ep, "--topic", "quiet", "--group", "g", "--wait-ms", "1500")
        assert empty.returncode == 0 and empty.stdout.strip() == "0 messages"
        assert 1.5 <= time.monotonic() - started < 4.0  # one wait, not one per queue (6 s)

        consume = subprocess.Popen([*CLI, "consume", *ep, "--topic", "quiet", "--group", "g", "--wait-ms", "8000",
                                    "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        until(lambda: parked_requests(engine) >= 1)
        sent_at = time.monotonic()
        client.send("quiet", [{"body": b"late"}], queue_id=3)
        out, err = consume.communicate(timeout=30)
        answered_s = time.monotonic() - sent_at
    assert consume.returncode == 0, err
    assert [m["body"] for m in json.loads(out)] == ["late"]
    assert answered_s < 4.0  # queue by queue, it waited out queues 0, 1 and 2 first: 8 s or more


@pytest.mark.timeout(30)
def test_the_exit_codes_are_documented() -> None:
    import engine.cli

    docs = (Path(__file__).parents[2] / "docs" / "client.md").read_text()
    for name in dir(engine.cli):
        if name.startswith("EXIT_"):
            assert f"| {getattr(engine.cli, name)} | `{name}` |" in docs, name


