"""How long a restart takes after a long log past the last transaction.

    .venv/bin/python scripts/bench_restart.py [--gib 1,4] [--body-size 10] [--store-dir DIR]

For each size S of ``--gib``, a fresh store (default config, ASYNC_FLUSH): one committed
transaction, then S GiB of sends to another topic (``--body-size``-byte bodies, batches of
1,000, one queue), a clean stop at once, and a start. Printed per size: the log past the
transaction, how much of it the transaction actor's look for commits already stored covers
(from its checkpoint's ``scan_from``), the time from the start of the supervisor to every
actor RUNNING (its "ready" line), to a new commit answered (the transaction actor serves
commits once its look is done), and whether the engine was RUNNING (not DEGRADED) then.

The checkpoint's ``scan_from`` passes the bulk while the engine runs (no op comes), so the
look at the start is short. ``--whole-look`` puts it back at the transaction's op before the
start (as a checkpoint written before it could pass the log), so that the look covers the
whole bulk: the time it takes in slices, with the actor heartbeating between them.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.client import EngineError, StoreClient
from engine.config import StoreConfig
from engine.errors import ErrorCode
from engine.ipc.control import control
from engine.ipc.messages import StatusQuery
from engine.store.transaction_state import load_transaction_checkpoint, store_transaction_checkpoint
from supervisor.launcher import EngineProcess

TX_TOPIC, BULK_TOPIC, GROUP = "bench-tx", "bench-bulk", "bench-producers"
GIB = 1 << 30


def commit_one(client: StoreClient, body: bytes) -> None:
    [result] = client.send(TX_TOPIC, [{"body": body}], queue_id=0, transaction=True, producer_group=GROUP)
    assert client.commit(str(result["msg_id"])) == "commit"


def send_retrying(client: StoreClient, batch: list[dict[str, bytes]]) -> None:
    """A send, again after BUSY (the writer's queue waited past send_queue_wait_ms_max: nothing stored)."""
    while True:
        try:
            client.send(BULK_TOPIC, batch, queue_id=0)
            return
        except EngineError as exc:
            if exc.code != ErrorCode.BUSY:
                raise


def log_end(client: StoreClient) -> int:
    return int(client.status()["offsets"]["confirmed_offset"])


@dataclass
class Result:
    past_bytes: int  # log written after the committed transaction
    look_bytes: int  # log the transaction actor looks through at the start
    fill_s: float
    running_s: float  # from the start of the supervisor to every actor RUNNING
    commit_s: float  # from the start of the supervisor to a new commit answered
    state: str  # RUNNING, or DEGRADED
    slowest: str  # the actor that took longest from spawn to RUNNING at the start, and how long


def slowest_recovery(store_dir: Path) -> str:
    """From the supervisor's log of the last start: its slowest "recovered in" line."""
    lines = (store_dir / "logs" / "supervisor.log").read_text().splitlines()
    last_pid = re.findall(r"supervisor\[(\d+)\]", lines[-1])
    times = [(int(m[2]), m[1]) for line in lines if last_pid and f"supervisor[{last_pid[0]}]" in line
             and (m := re.search(r"actor (\S+) recovered in (\d+) ms", line))]
    return f"{max(times)[1]} {max(times)[0]} ms" if times else "?"


def run(store_dir: Path, gib: float, body_size: int, *, whole_look: bool) -> Result:
    config = StoreConfig(metrics_endpoint="")
    engine = EngineProcess(store_dir, config=config, start_timeout_s=600)
    engine.start()
    try:
        with engine.client(timeout_ms=60_000) as client:
            client.create_topic(TX_TOPIC, queue_count=1)
            client.create_topic(BULK_TOPIC, queue_count=1)
            commit_one(client, b"before")
            first = log_end(client)  # past the op and its commit
            batch = [{"body": b"x" * body_size}] * 1_000
            fill_started = time.perf_counter()
            while log_end(client) - first < gib * GIB:
                for _ in range(50):
                    send_retrying(client, batch)
            fill_s = time.perf_counter() - fill_started
            past = log_end(client) - first
    finally:
        engine.stop(timeout_s=600)
    checkpoint = load_transaction_checkpoint(store_dir)
    if whole_look:
        checkpoint.scan_from = min(checkpoint.scan_from, first)
        store_transaction_checkpoint(store_dir, checkpoint)
    started = time.perf_counter()
    engine.start()
    try:
        running_s = time.perf_counter() - started
        with engine.client(timeout_ms=600_000) as client:
            commit_one(client, b"after")
            commit_s = time.perf_counter() - started
            end = log_end(client)
        state = control(engine.store_dir, StatusQuery()).state
    finally:
        engine.stop(timeout_s=600)
    slowest = slowest_recovery(store_dir)
    return Result(past, max(0, end - checkpoint.scan_from), fill_s, running_s, commit_s, state, slowest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", default="1,4", help="sizes of log past the last transaction, GiB (comma-separated)")
    parser.add_argument("--body-size", type=int, default=10)
    parser.add_argument("--whole-look", action="store_true",
                        help="start with scan_from at the transaction: the look covers the whole bulk")
    parser.add_argument("--store-dir", type=Path, default=None, help="where the stores go (default: a temp dir)")
    args = parser.parse_args()
    root = args.store_dir or Path(tempfile.mkdtemp(prefix="bench-restart-"))
    print(f"{'log past tx':>12} {'look covers':>12} {'fill s':>8} {'all RUNNING s':>14} {'commit s':>9}  state    "
          f"slowest actor")
    for size in (float(s) for s in args.gib.split(",")):
        store = root / f"store-{size:g}gib"
        shutil.rmtree(store, ignore_errors=True)
        r = run(store, size, args.body_size, whole_look=args.whole_look)
        print(f"{r.past_bytes / GIB:>10.2f} G {r.look_bytes / GIB:>10.2f} G {r.fill_s:>8.1f} {r.running_s:>14.2f} "
              f"{r.commit_s:>9.2f}  {r.state:<8} {r.slowest}", flush=True)
        shutil.rmtree(store, ignore_errors=True)
    if args.store_dir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
