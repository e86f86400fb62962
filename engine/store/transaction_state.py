"""The transaction actor's checkpoint (``config/transactions.json``), written whole and atomically.

``half_next`` and ``op_next``: the next queue offsets of ``RMQ_SYS_TRANS_HALF_TOPIC`` and
``RMQ_SYS_TRANS_OP_HALF_TOPIC`` to read. Every op before ``op_next`` is applied: a commit's
message is in its real topic. ``scan_from``: where the last op before ``op_next`` ends in
the log, or further while no op comes (up to where every op was read, within the flushed
offset); every commit of a later op lies past it, and a restart looks there for commits
already stored. ``halves_read_to``: the
commit-log end of the last half read (a half below it and not in ``halves`` is decided).
``halves``: the half messages
read and not decided by an op before ``op_next``, with how often they were checked. Every
offset and every half named lies below the flushed offset when the file is written.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from engine.store.atomic_file import read_with_backup, write_atomically

TRANSACTIONS_FILE = "config/transactions.json"


class Half(msgspec.Struct, array_like=True):
    commit_log_offset: int
    queue_offset: int
    store_ms: int
    producer_group: str
    checks: int = 0


class TransactionCheckpoint(msgspec.Struct, kw_only=True):
    half_next: int = 0
    op_next: int = 0
    scan_from: int = 0
    halves_read_to: int = 0
    halves: list[Half] = []


def load_transaction_checkpoint(store_dir: Path) -> TransactionCheckpoint:
    loaded = read_with_backup(store_dir / TRANSACTIONS_FILE,
                              lambda data: msgspec.json.decode(data, type=TransactionCheckpoint))
    return loaded if loaded is not None else TransactionCheckpoint()


def store_transaction_checkpoint(store_dir: Path, checkpoint: TransactionCheckpoint) -> None:
    write_atomically(store_dir / TRANSACTIONS_FILE, msgspec.json.encode(checkpoint))
