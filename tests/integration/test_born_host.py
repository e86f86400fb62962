"""BORNHOST is the sending client's address, as a RocketMQ broker takes it from the connection.

ZeroMQ tells the front a TCP peer's IP (not its port): a record sent over IPv6 gets a 16-byte
BORNHOST and SYSFLAG 0x10, one sent over IPv4 a 4-byte one; the port is 0. The raw bytes are
read from the CommitLog file itself (``shared/reference/rocketmq-store.md`` section 1.1).
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from engine.actors.base import peer_ip
from engine.client import StoreClient
from engine.config import StoreConfig
from engine.offline.check import check_store
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(60)

TOPIC = "born"
AT_SYSFLAG, AT_BORNHOST = 36, 48


def pull_all(client: StoreClient, count: int) -> list[dict[str, Any]]:
    """The first ``count`` messages of queue 0, waiting (long polls) for them to be dispatched."""
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10
    while len(messages) < count and time.monotonic() < deadline:
        messages += client.pull(TOPIC, 0, len(messages), max_wait_ms=1000)["messages"]
    assert len(messages) == count
    return messages


def ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def raw_record(store_dir: Path, commit_log_offset: int) -> tuple[int, bytes]:
    """(SYSFLAG, the bytes from BORNHOST on) of the record at ``commit_log_offset`` in segment 0."""
    raw = (store_dir / "commitlog" / f"{0:020d}").read_bytes()
    (sys_flag,) = struct.unpack_from(">i", raw, commit_log_offset + AT_SYSFLAG)
    return sys_flag, raw[commit_log_offset + AT_BORNHOST:commit_log_offset + AT_BORNHOST + 20]


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_a_client_over_ipv6_is_the_born_host_of_its_records(store_dir: Path) -> None:
    engine = EngineProcess(store_dir, config=StoreConfig.test_min(), host="::1")
    assert engine.endpoint.startswith("tcp://[::1]:")
    engine.start()
    try:
        with engine.client() as client:
            client.create_topic(TOPIC, queue_count=1)
            stored = client.send(TOPIC, [{"body": b"six %d" % i} for i in range(2)], queue_id=0)
            messages = pull_all(client, 2)
            assert [(m["born_host"], m["sys_flag"]) for m in messages] == [("[::1]:0", 0x10)] * 2
            assert [m["store_host"] for m in messages] == [f"127.0.0.1:{engine.port}"] * 2  # the store's own
            by_id = client.get_by_id(stored[1]["msg_id"])
            assert (by_id["body"], by_id["born_host"], by_id["sys_flag"]) == (b"six 1", "[::1]:0", 0x10)
    finally:
        assert engine.stop() == 0
    sys_flag, born = raw_record(store_dir, stored[1]["commit_log_offset"])
    assert sys_flag & 0x10 and not sys_flag & 0x20
    assert born[:16] == socket.inet_pton(socket.AF_INET6, "::1")
    assert born[16:20] == struct.pack(">i", 0)  # ZeroMQ gives no port
    assert check_store(store_dir, engine.config) == []


def test_a_client_over_ipv4_is_the_born_host_of_its_records(engine: EngineProcess, store_dir: Path) -> None:
    """The send creates its topic: it waits for the topic table's write and keeps its address."""
    with engine.client() as client:
        stored = client.send(TOPIC, [{"body": b"four"}], queue_id=0)
        (message,) = pull_all(client, 1)
        assert (message["born_host"], message["sys_flag"]) == ("127.0.0.1:0", 0)
        assert message["store_host"] == f"127.0.0.1:{engine.port}"
    assert engine.stop() == 0
    sys_flag, born = raw_record(store_dir, stored[0]["commit_log_offset"])
    assert sys_flag & 0x30 == 0
    assert born[:8] == socket.inet_aton("127.0.0.1") + struct.pack(">i", 0)


def test_peer_addresses_as_record_hosts() -> None:
    """ZeroMQ's "Peer-Address" text: IPv4, IPv6 (a mapped IPv4 one is IPv4, a zone is dropped);
    an ipc:// peer's ("localhost:uid:gid:pid") is no address: the record keeps the store host."""
    assert peer_ip("10.1.2.3") == bytes([10, 1, 2, 3])
    assert peer_ip("::1") == socket.inet_pton(socket.AF_INET6, "::1")
    assert peer_ip("::ffff:10.1.2.3") == bytes([10, 1, 2, 3])
    assert peer_ip("fe80::1%eth0") == socket.inet_pton(socket.AF_INET6, "fe80::1")
    assert peer_ip("localhost:0:0:4242") == b""
    assert peer_ip("") == b""
