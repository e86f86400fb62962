"""Stores a RocketMQ broker wrote: records with fields this engine does not write itself.

The records here are built byte for byte from the documented layout
(``shared/reference/rocketmq-store.md`` section 1.1, ``MessageExtEncoder``), with
``struct`` and ``zlib`` only: not with the engine's encoder, whose own reading of the
layout is what is under test.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import zlib
from pathlib import Path

import pytest

from engine.config import StoreConfig
from engine.offline.check import check_store
from engine.services.recovery import plan_commit_log_recovery
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(120)

SEGMENT_BYTES = 256 * 1024
TOPIC = "six"
STORE_TS = 1_760_000_000_000


def rocketmq_record(*, offset: int, queue_offset: int, body: bytes, properties: dict[str, str],
                    born: tuple[str, int], store: tuple[str, int], topic: str = TOPIC, queue_id: int = 0,
                    sys_flag: int = 0, prepared_offset: int = 0, store_ts: int = STORE_TS) -> bytes:
    """One v1 CommitLog record as MessageExtEncoder#encode writes it; an address with a colon is
    IPv6: 16 bytes and SYSFLAG 0x10 (born host) or 0x20 (store host)."""
    def host(address: tuple[str, int], v6_flag: int) -> tuple[bytes, int]:
        ip, port = address
        if ":" in ip:
            return socket.inet_pton(socket.AF_INET6, ip) + struct.pack(">i", port), v6_flag
        return socket.inet_aton(ip) + struct.pack(">i", port), 0

    born_bytes, born_flag = host(born, 0x10)
    store_bytes, store_flag = host(store, 0x20)
    props = "".join(f"{name}\x01{value}\x02" for name, value in properties.items()).encode()
    topic_bytes = topic.encode()
    total = (4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + len(born_bytes) + 8 + len(store_bytes) + 4 + 8
             + 4 + len(body) + 1 + len(topic_bytes) + 2 + len(props))
    return b"".join([
        struct.pack(">iIiiiqqiq", total, 0xDAA320A7, zlib.crc32(body) & 0x7FFFFFFF, queue_id, 0, queue_offset,
                    offset, sys_flag | born_flag | store_flag, STORE_TS - 5),
        born_bytes, struct.pack(">q", store_ts), store_bytes, struct.pack(">iq", 0, prepared_offset),
        struct.pack(">i", len(body)), body, struct.pack(">B", len(topic_bytes)), topic_bytes,
        struct.pack(">H", len(props)), props])


# (born host, store host) of each record: IPv4 and IPv6 in every combination, the last at the log's end.
HOSTS = [
    (("10.0.0.7", 40001), ("192.168.1.2", 10911)),
    (("2001:db8::1", 40002), ("192.168.1.2", 10911)),
    (("10.0.0.7", 40003), ("fe80::1:2", 10911)),
    (("2001:db8::1", 40004), ("2001:db8::99", 10911)),
    (("::1", 40005), ("2001:db8::99", 10911)),
]


def config() -> StoreConfig:
    return StoreConfig.test_min().replace(segment_size_bytes=SEGMENT_BYTES, message_body_bytes_max=16 * 1024,
                                          send_batch_bytes_max=64 * 1024)


def write_broker_log(store_dir: Path) -> list[tuple[int, bytes]]:
    """The records of HOSTS at the start of the first segment; (offset, body) of each."""
    segment = store_dir / "commitlog" / f"{0:020d}"
    segment.parent.mkdir(parents=True, exist_ok=True)
    data = bytearray(SEGMENT_BYTES)
    written, at = [], 0
    for i, (born, store) in enumerate(HOSTS):
        body = b"from a broker %d" % i
        record = rocketmq_record(offset=at, queue_offset=i, body=body, born=born, store=store,
                                 properties={"KEYS": f"key{i}", "UNIQ_KEY": f"{i:032X}", "WAIT": "true"})
        data[at:at + len(record)] = record
        written.append((at, body))
        at += len(record)
    segment.write_bytes(data)
    return written


def host_text(address: tuple[str, int]) -> str:
    ip, port = address
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def assert_served(engine: EngineProcess, written: list[tuple[int, bytes]]) -> None:
    with engine.client() as client:
        stats = client.queue_stats(TOPIC, 0)
        assert (stats["min_offset"], stats["max_offset"]) == (0, len(written))
        messages = client.pull(TOPIC, 0, 0)["messages"]
        assert [m["body"] for m in messages] == [body for _offset, body in written]
        for message, (offset, _body), (born, store) in zip(messages, written, HOSTS, strict=False):
            assert message["commit_log_offset"] == offset
            assert (message["born_host"], message["store_host"]) == (host_text(born), host_text(store))
            assert client.get_by_id(message["msg_id"])["body"] == message["body"]
            assert client.get_by_offset(offset)["msg_id"] == message["msg_id"]
        # an IPv6 store host makes a 28-byte offsetMsgId (MessageDecoder#createMessageId): 56 hex digits
        assert [len(m["msg_id"]) for m in messages[:len(HOSTS)]] == [32, 32, 56, 56, 56]
        assert [m["body"] for m in client.query_by_key(TOPIC, "key3")] == [written[3][1]]


def test_records_with_ipv6_hosts_are_served_checked_and_kept_by_recovery(store_dir: Path) -> None:
    with EngineProcess(store_dir, config=config()) as engine, engine.client() as client:
        client.create_topic(TOPIC, queue_count=1)
    shutil.rmtree(store_dir / "commitlog")
    written = write_broker_log(store_dir)

    plan = plan_commit_log_recovery(store_dir, config())  # all five lie past the checkpoint: the tail
    assert plan.damage == [] and plan.end_offset == written[-1][0] + len(rocketmq_record(
        offset=0, queue_offset=4, body=written[-1][1], born=HOSTS[-1][0], store=HOSTS[-1][1],
        properties={"KEYS": "key4", "UNIQ_KEY": f"{4:032X}", "WAIT": "true"}))

    engine = EngineProcess(store_dir, config=config())
    engine.start()
    try:
        assert_served(engine, written)
        with engine.client() as client:  # one record after them: now they lie in the middle
            [after] = client.send(TOPIC, [{"body": b"after the broker's records"}], queue_id=0)
            written.append((after["commit_log_offset"], b"after the broker's records"))
    finally:
        engine.kill()
    # No checkpoint: recovery scans the whole log, the broker's records in its middle (the engines
    # above may have run too short a time for the flusher's first one)
    (store_dir / "checkpoint").unlink(missing_ok=True)
    plan = plan_commit_log_recovery(store_dir, config())
    assert plan.damage == [] and plan.end_offset > written[-1][0]

    engine = EngineProcess(store_dir, config=config())
    engine.start()
    try:
        assert_served(engine, written)
    finally:
        assert engine.stop() == 0
    assert check_store(store_dir, config()) == []
    assert os.path.getsize(store_dir / "commitlog" / f"{0:020d}") == SEGMENT_BYTES


def test_an_engine_on_an_ipv6_store_host_writes_ipv6_hosts_as_a_broker_does(store_dir: Path) -> None:
    """store_host "2001:db8::7": STOREHOST is 20 bytes with SYSFLAG 0x20, ids are 56 hex digits, and
    a restart reads the records back. BORNHOST is the client's, 127.0.0.1 (port 0): 8 bytes."""
    ipv6 = config().replace(store_host="2001:db8::7")
    with EngineProcess(store_dir, config=ipv6) as engine, engine.client() as client:
        client.create_topic(TOPIC, queue_count=1)
        stored = client.send(TOPIC, [{"body": b"v6 %d" % i, "keys": [f"k{i}"]} for i in range(3)], queue_id=0)
        assert [len(r["msg_id"]) for r in stored] == [56] * 3
        assert client.get_by_id(stored[1]["msg_id"])["body"] == b"v6 1"
    engine = EngineProcess(store_dir, config=ipv6)
    engine.start()
    try:
        with engine.client() as client:
            messages = client.pull(TOPIC, 0, 0)["messages"]
            assert [m["body"] for m in messages] == [b"v6 0", b"v6 1", b"v6 2"]
            port = int(stored[0]["msg_id"][32:40], 16)  # the first run's: the launcher picks one per start
            assert {(m["born_host"], m["store_host"], m["sys_flag"]) for m in messages} == \
                {("127.0.0.1:0", f"[2001:db8::7]:{port}", 0x20)}
            assert [len(m["uniq_key"]) for m in messages] == [56] * 3
            assert [m["msg_id"] for m in messages] == [r["msg_id"] for r in stored]
    finally:
        assert engine.stop() == 0
    raw = (store_dir / "commitlog" / f"{0:020d}").read_bytes()
    at = stored[2]["commit_log_offset"]
    (sys_flag,) = struct.unpack_from(">i", raw, at + 36)
    assert sys_flag == 0x20
    assert raw[at + 48:at + 56] == socket.inet_aton("127.0.0.1") + struct.pack(">i", 0)  # BORNHOST and its port
    assert raw[at + 64:at + 80] == socket.inet_pton(socket.AF_INET6, "2001:db8::7")  # STOREHOST after STORETIMESTAMP
    assert check_store(store_dir, ipv6) == []
