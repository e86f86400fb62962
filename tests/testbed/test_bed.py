"""The test bed of hosts (``harness/testbed``): hosts reach each other and nothing else; a cut,
a partition and a loss drop what they say, both ways, and heal; a delayed link holds each chunk
its delay and keeps the order; a host's wall clock jumps and heals; everything started is
stopped, namespaces included, also after a failure and after an owner that died. All traffic
stays inside the bed's namespaces."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from harness.testbed import TestBed, clock, netns
from harness.testbed.bed import NETWORK
from tests.helpers import require

pytestmark = pytest.mark.timeout(60)

PORT = 6000
ECHO_TIMEOUT_S = 10.0  # a TCP retransmission after a heal may wait a backed-off timer
CUT_PROBE_S = 0.5  # how long a host cut off is given to answer, and does not


@contextmanager
def echo(bed: TestBed, host: str) -> Iterator[None]:
    """A TCP echo on ``host``'s address, every connection served by a thread of its own."""
    def listening() -> socket.socket:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bed.address(host), PORT))
        sock.listen()
        return sock

    server = bed.call(host, listening)

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def accept() -> None:
        try:
            while True:
                conn, _ = server.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()
        except OSError:
            pass  # closed

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()


def connect(bed: TestBed, host: str, to: str, timeout_s: float = ECHO_TIMEOUT_S) -> socket.socket:
    conn = bed.call(host, lambda: socket.create_connection((bed.address(to), PORT), timeout=timeout_s))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def round_trip(conn: socket.socket, data: bytes = b"ping") -> bytes:
    conn.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = conn.recv(len(data) - len(got))
        assert chunk, "the connection ended"
        got += chunk
    return got


def reaches(bed: TestBed, host: str, to: str) -> bool:
    try:
        with connect(bed, host, to, CUT_PROBE_S) as conn:
            return round_trip(conn) == b"ping"
    except OSError:
        return False


def test_hosts_reach_each_other_and_nothing_leaves_the_bed(tmp_path: Path) -> None:
    with TestBed(tmp_path, ["a", "b"]) as bed, echo(bed, "b"):
        with connect(bed, "a", "b") as conn:
            assert round_trip(conn) == b"ping"
        for host in bed.hosts.values():
            routes = netns.ip("-n", host.namespace, "-4", "route", "show").split("\n")
            assert [r.split()[0] for r in routes if r.strip()] == [str(NETWORK)], routes  # no default route
            addresses = netns.ip("-n", host.namespace, "-4", "-o", "addr", "show").split()
            assert {a.split("/")[0] for a in addresses if "/" in a} == {"127.0.0.1", host.address}
        root = [a.split("/")[0] for a in netns.ip("-4", "-o", "addr", "show").split() if "/" in a]
        assert not [a for a in root if ipaddress.ip_address(a) in NETWORK], root  # the root namespace is outside


@pytest.mark.parametrize("relayed", [False, True])
def test_a_cut_drops_both_ways_and_heals(tmp_path: Path, relayed: bool) -> None:
    with TestBed(tmp_path, ["a", "b", "c"], relayed=relayed) as bed, echo(bed, "a"), echo(bed, "b"), echo(bed, "c"):
        kept = connect(bed, "a", "b")  # open before the cut: it stalls, and goes on after the heal
        assert round_trip(kept) == b"ping"
        bed.partition(["a"], ["b"])
        assert not reaches(bed, "a", "b") and not reaches(bed, "b", "a")
        assert reaches(bed, "a", "c") and reaches(bed, "b", "c") and reaches(bed, "c", "a")  # in no group
        kept.settimeout(CUT_PROBE_S)
        kept.sendall(b"held")
        with pytest.raises(TimeoutError):
            kept.recv(4)
        bed.heal()
        kept.settimeout(ECHO_TIMEOUT_S)
        assert kept.recv(4) == b"held"
        assert reaches(bed, "a", "b") and reaches(bed, "b", "a")
        kept.close()


def test_a_host_losing_every_packet_is_cut_off_and_half_loses_about_half(tmp_path: Path) -> None:
    with TestBed(tmp_path, ["a", "b"]) as bed, echo(bed, "b"):
        bed.loss("b", 100)
        assert not reaches(bed, "a", "b")
        bed.heal()
        assert reaches(bed, "a", "b")
        bed.loss("b", 50)

        def receiver() -> socket.socket:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((bed.address("b"), PORT))
            sock.settimeout(CUT_PROBE_S)
            return sock

        inbox = bed.call("b", receiver)
        sender = bed.call("a", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        sent = 400
        for k in range(sent):
            sender.sendto(k.to_bytes(2, "big"), (bed.address("b"), PORT))
        got = 0
        try:
            while got < sent:
                inbox.recv(2)
                got += 1
        except TimeoutError:
            pass  # the rest were dropped
        inbox.close()
        sender.close()
        assert 0.3 * sent < got < 0.7 * sent, got  # 50 % at random: 400 draws stay within 30-70 % (10 sigma)


def test_a_delayed_link_holds_each_chunk_its_delay_and_keeps_the_order(tmp_path: Path) -> None:
    with TestBed(tmp_path, ["a", "b"], relayed=True) as bed, echo(bed, "b"):
        conn = connect(bed, "a", "b")
        bed.delay("a", "b", 20, jitter_ms=10)
        for _ in range(10):
            began = time.monotonic()
            assert round_trip(conn) == b"ping"
            assert time.monotonic() - began >= 0.040  # held 20 ms each way at least, on a connection already open
        numbered = b"".join(k.to_bytes(4, "big") for k in range(2_000))
        for k in range(0, len(numbered), 40):
            conn.sendall(numbered[k:k + 40])  # many chunks, each with its own jitter: they come back in order
        got = b""
        while len(got) < len(numbered):
            got += conn.recv(65536)
        assert got == numbered
        bed.heal()
        took = []
        for _ in range(10):
            began = time.monotonic()
            round_trip(conn)
            took.append(time.monotonic() - began)
        assert sorted(took)[5] < 0.040, took  # no longer held
        conn.close()


def test_everything_it_started_is_stopped_after_a_failure_and_after_a_dead_owner(tmp_path: Path) -> None:
    started: list[int] = []
    with pytest.raises(RuntimeError, match="the test failed"), TestBed(tmp_path, ["a"], relayed=True) as bed:
        process = bed.popen("a", ["sleep", "60"])
        started += [process.pid, *(relay.pid for relay in bed.relays.values())]
        raise RuntimeError("the test failed")
    assert not [pid for pid in started if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    process.wait()
    # A bed whose owner died: its namespace and what runs there are swept by the next bed.
    owner = subprocess.Popen(["true"])
    owner.wait()
    stale = f"{netns.PREFIX}{owner.pid}-left"
    netns.create(stale)
    left = subprocess.Popen([*netns.exec_prefix(stale), "sleep", "60"])
    with TestBed(tmp_path / "next", ["a"]):
        assert stale not in netns.namespaces()
    left.wait(10)  # killed (by then reaped by the sweep, which waits for what it kills)
    assert not psutil.pid_exists(left.pid)


CLOCK_PROBE = """
import sys, time
for line in sys.stdin:
    time.sleep(0.01)  # CPython's sleep, which libfaketime 0.9.10 alone would refuse
    print(time.time() - time.monotonic(), flush=True)
"""


def test_a_host_s_wall_clock_jumps_and_heals_while_its_monotonic_clock_runs_on(tmp_path: Path) -> None:
    require(clock.library() is not None, "libfaketime (Debian's faketime)")
    with TestBed(tmp_path, ["a"], clocks=True) as bed:
        process = subprocess.Popen([*bed.prefix("a"), "env", *(f"{k}={v}" for k, v in bed.environment("a").items()),
                                    sys.executable, "-c", CLOCK_PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True)
        assert process.stdin is not None and process.stdout is not None

        def offset() -> float:  # the process's wall clock less its monotonic one, less ours
            process.stdin.write("\n")
            process.stdin.flush()
            return float(process.stdout.readline()) - (time.time() - time.monotonic())

        def settles(expected_s: int) -> None:
            deadline = time.monotonic() + 5 * clock.JUMP_SETTLE_S
            while abs((seen := offset()) - expected_s) > 1.0:
                assert time.monotonic() < deadline, (seen, expected_s)

        try:
            settles(0)
            bed.jump_clock("a", -3600)
            settles(-3600)  # the monotonic clock has not moved with it: the difference is the jump
            bed.jump_clock("a", 60)
            settles(60)
            bed.heal()
            settles(0)
        finally:
            process.stdin.close()
            process.wait(10)
            process.stdout.close()
