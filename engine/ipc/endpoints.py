"""The one table of internal endpoints, socket options and the run directory.

Internal sockets are ``ipc://`` files in a private run directory (mode 0700)
derived from the store directory, so two engines on two stores never meet,
and a path stays short enough for a Unix socket (108 bytes).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TypeVar

import zmq

RUN_DIR_ROOT = Path(os.environ.get("RMQPY_RUN_ROOT", "/tmp"))

WRITER = "writer.sock"
WRITER_PUB = "writer-pub.sock"
FLUSHER_PUB = "flusher-pub.sock"
REPUT_PUB = "reput-pub.sock"
REPLICATION_PUB = "replication-pub.sock"
FRONT_INTERNAL = "front-internal.sock"  # the client protocol for actors that are clients (timer, transactions)
TRANSACTIONS = "transactions.sock"
SUPERVISOR_CONTROL = "supervisor.sock"
SUPERVISOR_EVENTS = "events.sock"
SUPERVISOR_HEARTBEATS = "heartbeats.sock"

ENGINE_STATE_FILE = "supervisor.json"
MASTER_ENDPOINT_FILE = "master-endpoint"  # on a replica: where its master's clients connect (the receiver's)
CRASH_START_FILE = "crash-start"  # after an unclean stop, until every actor has recovered once
REPLICA_APPEND_LOCK = "replica-append.lock"  # flock: a replica's writer appends, or the supervisor reads the log

TOPIC_CONFIRMED = b"confirmed"
TOPIC_FLUSHED = b"flushed"
TOPIC_REPLICATED = b"replicated"
TOPIC_INDEX = b"ix"
TOPIC_EVENT = b"event"


def owner_endpoint_name(instance: int) -> str:
    return f"owner-{instance}.sock"


def owner_topic(instance: int) -> bytes:
    return f"cq.{instance}.".encode()


def run_dir_for(store_dir: Path) -> Path:
    digest = hashlib.sha1(str(store_dir.resolve()).encode()).hexdigest()[:16]
    return RUN_DIR_ROOT / f"rmqpy-{digest}"


def ensure_run_dir(store_dir: Path) -> Path:
    run_dir = run_dir_for(store_dir)
    run_dir.mkdir(mode=0o700, exist_ok=True)
    os.chmod(run_dir, 0o700)
    return run_dir


def ipc(run_dir: Path, name: str) -> str:
    return f"ipc://{run_dir / name}"


# Any socket, blocking or asyncio (whatever its recv returns): the options below are the same.
SocketT = TypeVar("SocketT", bound="zmq.Socket[object]")
_RECONNECT_IVL_MS = 10


def configure(sock: SocketT, *, hwm: int, max_message_bytes: int = -1) -> SocketT:
    """Options every socket gets: no linger at close, bounded queues, and a retry of a connect
    every 10 ms (ZeroMQ's default is 100 ms). An actor connects to the endpoints of later waves
    before they are bound (the writer to the flusher's), and the start lets a wave recover as soon
    as the one before runs: so the first connect after a bind comes ms after it, well before
    the engine's ready line (``Supervisor.start``). A PUB's message sent before it is dropped."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, _RECONNECT_IVL_MS)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    if max_message_bytes > 0:
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    return sock


def allow_ipv6(sock: SocketT, address: str) -> SocketT:
    """IPv6 on for a ``tcp://[v6 address]:port`` endpoint: without it ZeroMQ refuses to bind one
    ("No such device") and never connects to one. Left off otherwise, so that a host name such
    as ``localhost`` keeps resolving to the IPv4 address an engine bound on 127.0.0.1 listens on."""
    if address.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)
    return sock


class NotRunning(RuntimeError):
    """No engine runs on this store directory."""


def namespaces() -> dict[str, int]:
    """The network and pid namespaces of this process, by the inode of ``/proc/self/ns/*`` (none
    without /proc): the state file records them, so that a search of ``RUN_DIR_ROOT``, which
    processes of other namespaces share, takes only the engines this process can reach (a
    namespace's 127.0.0.1 is its own, and a pid names another process in another pid namespace)."""
    found = {}
    for key, name in (("net_ns", "net"), ("pid_ns", "pid")):
        try:
            found[key] = os.stat(f"/proc/self/ns/{name}").st_ino
        except OSError:
            continue
    return found


def in_these_namespaces(state: dict[str, object]) -> bool:
    """Whether the engine of ``state`` runs in this process's namespaces (one whose state file
    records none, written before they were recorded, is taken to)."""
    return all(state.get(key, inode) == inode for key, inode in namespaces().items())


def read_engine_state(store_dir: Path) -> dict[str, object]:
    """pid, endpoint and store of the engine running on ``store_dir``; NotRunning if none."""
    try:
        state: dict[str, object] = json.loads((run_dir_for(store_dir) / ENGINE_STATE_FILE).read_text())
        return state  # decoded JSON: the object the supervisor writes (supervisor.supervisor)
    except (FileNotFoundError, json.JSONDecodeError):
        raise NotRunning(f"no engine is running on {store_dir}") from None
