"""A master and its replica on loopback, for tests and the simulation of a failure by hand.

``replicated_pair`` starts both engines (the replica pointed at the master's replication
endpoint) and stops both (``replicated_set``: a master and several replicas);
``wait_replicated`` waits, with a deadline, until the replica's log ends where the master's
does and its own dispatch has caught up; ``log_bytes`` reads a store's log from its files, to
compare two stores byte for byte.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.client import EngineError, StoreClient
from engine.config import StoreConfig
from engine.layout import offset_to_file_name
from engine.store.commit_log import COMMIT_LOG_DIR
from supervisor.launcher import EngineProcess, free_port


@contextmanager
def replicated_pair(root: Path, config: StoreConfig) -> Iterator[tuple[EngineProcess, EngineProcess]]:
    """A master (``root/master``) and its replica (``root/replica``), started in that order."""
    with replicated_set(root, config, replicas=1) as (master, [replica]):
        yield master, replica


@contextmanager
def replicated_set(root: Path, config: StoreConfig, *,
                   replicas: int) -> Iterator[tuple[EngineProcess, list[EngineProcess]]]:
    """A master (``root/master``) and ``replicas`` replicas of it (``root/replica``, ``root/replica-2``...),
    started in that order and stopped in the other."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    engines = [EngineProcess(root / "master", config=config.replace(replication_endpoint=endpoint))]
    engines += [EngineProcess(root / ("replica" if n == 1 else f"replica-{n}"),
                              config=config.replace(replica_of=endpoint)) for n in range(1, replicas + 1)]
    with contextlib.ExitStack() as stack:
        for engine in engines:
            engine.start()
            stack.callback(engine.stop)
        yield engines[0], engines[1:]


def offsets(client: StoreClient) -> dict[str, int]:
    offsets: dict[str, int] = client.status()["offsets"]
    return offsets


def wait_replicated(master: StoreClient, replica: StoreClient, *, timeout_s: float = 30.0) -> int:
    """The master's log end, once the replica's log ends there and its queues and index hold it all."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, int] = {}
    while time.monotonic() < deadline:
        try:
            end = offsets(master)["written_offset"]
            seen = offsets(replica)
        except EngineError as exc:  # an actor restarting
            if exc.name != "SERVICE_NOT_AVAILABLE":
                raise
            continue
        applied = [v for k, v in seen.items() if k.endswith("applied_offset")]
        if seen["written_offset"] == end and all(v >= end for v in applied):
            return end
    raise TimeoutError(f"the replica did not catch up within {timeout_s} s: {seen}")


def log_bytes(store_dir: Path, start: int, end: int, segment_size_bytes: int) -> bytes:
    """The store's log bytes [start, end), read from its segment files."""
    parts = []
    offset = start
    while offset < end:
        segment_start = offset - offset % segment_size_bytes
        stop = min(end, segment_start + segment_size_bytes)
        with open(store_dir / COMMIT_LOG_DIR / offset_to_file_name(segment_start), "rb") as segment:
            segment.seek(offset - segment_start)
            parts.append(segment.read(stop - offset))
        offset = stop
    return b"".join(parts)
