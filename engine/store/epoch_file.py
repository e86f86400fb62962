"""The epoch file: which epoch of its broker set wrote each stretch of this store's log.

Kafka's leader-epoch checkpoint and RocketMQ 5's ``EpochFileCache``: one line per epoch, the
epoch and the commit log offset of its first byte here, oldest first::

    3 0
    4 1048576
    6 9437184

A master adds its epoch's line when it is elected (its log's end then); a replica adds one
before it appends the first bytes a master of a newer epoch sent. Read beside the broker set's
history (every epoch and where it began, kept in etcd), it says where this log stops being the
set's: ``truncation_point``. Replaced whole (``write_atomically``).
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from engine.store.atomic_file import write_atomically

EPOCH_FILE = "epochs"

Epochs = list[tuple[int, int]]  # (epoch, start offset), oldest first


def load_epochs(store_dir: Path) -> Epochs:
    try:
        text = (store_dir / EPOCH_FILE).read_text()
    except FileNotFoundError:
        return []
    epochs = []
    for line in text.splitlines():
        if line.strip():
            epoch, start = line.split()
            epochs.append((int(epoch), int(start)))
    return epochs


def save_epochs(store_dir: Path, epochs: Epochs) -> None:
    write_atomically(store_dir / EPOCH_FILE, "".join(f"{epoch} {start}\n" for epoch, start in epochs).encode())


def add_epoch(store_dir: Path, epoch: int, start_offset: int) -> None:
    """Note that ``epoch`` begins at ``start_offset`` here; nothing if it is no newer than the last."""
    epochs = load_epochs(store_dir)
    if epochs and epochs[-1][0] >= epoch:
        return
    save_epochs(store_dir, [*epochs, (epoch, start_offset)])


def truncation_point(local: Epochs, history: Epochs) -> int | None:
    """Where this log must be cut to be a prefix of the broker set's (None: nowhere).

    Each epoch of ``local`` holds the bytes from its start to the next local epoch's start (the
    last one: to the log's end). In the set's ``history`` an epoch ends where the next one
    began: bytes an epoch wrote here past that end never reached the master after it (a master
    that lost its lease with bytes not yet replicated, Kafka's KIP-101 case), so the log is cut
    there. An epoch the set never had (its election did not happen) is cut at its start.
    """
    starts = dict(history)
    ends = {epoch: start for (epoch, _), (_, start) in pairwise(history)}
    for k, (epoch, start) in enumerate(local):
        if epoch not in starts:
            return start
        set_end = ends.get(epoch)
        if set_end is None:  # the set's current epoch: still open
            return None
        local_end = local[k + 1][1] if k + 1 < len(local) else None  # None: up to the log's end
        if local_end is None or local_end > set_end:
            return max(set_end, start)
    return None


def trim_epochs(epochs: Epochs, end_offset: int) -> Epochs:
    """The epochs that still begin below ``end_offset`` once the log is cut there."""
    return [(epoch, start) for epoch, start in epochs if start < end_offset]


def epoch_problems(store_dir: Path, log_end: int) -> list[str]:
    """What ``engine check`` reports of the epoch file: lines it cannot read, epochs not increasing,
    starts going back or past the log's end."""
    try:
        epochs = load_epochs(store_dir)
    except ValueError as exc:
        return [f"unreadable: {exc}"]
    problems = []
    for (epoch, start), (next_epoch, next_start) in pairwise(epochs):
        if next_epoch <= epoch or next_start < start:
            problems.append(f"epoch {next_epoch} at {next_start} follows epoch {epoch} at {start}")
    problems += [f"epoch {epoch} begins at {start}, past the log's end {log_end}"
                 for epoch, start in epochs if start > log_end]
    return problems
