"""A history of operations, Jepsen's way: each client writes what it asked and what came of it.

An operation is invoked, then completes with one of three outcomes:

    ok      it took effect: a send stored at the position the engine answered, a read that read
    fail    it did not take effect (kept for what the checker may say of it)
    info    indeterminate: it may or may not have taken effect (a timeout, a broken connection)

Sends carry the message's value (its body, unique in the run) and, when the engine answered,
where it was stored (a send ok is a ``PUT_OK``; ``FLUSH_SLAVE_TIMEOUT`` is info: stored by the
master, not known to be on a replica):
(topic, queue, queue offset), the log offset and the engine that answered (the store host of its
message id). Reads carry what they read at (topic, queue, offset). An observer notes each engine
that answers its route as master, and of which epoch. The nemesis notes each fault as it starts
and as it heals. Times are ``time.monotonic()`` in seconds.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Literal

import msgspec

Outcome = Literal["ok", "fail", "info"]


class Stored(msgspec.Struct, frozen=True, array_like=True):
    topic: str
    queue_id: int
    queue_offset: int
    log_offset: int
    host: str  # the engine that answered, from the message id's store host
    epoch: int = 0  # the epoch of the master that stored it, from the reply


class Op(msgspec.Struct, frozen=True, kw_only=True):
    process: str  # the client, or "nemesis"
    f: str  # send, read, or a fault's name
    outcome: Outcome | Literal["start", "heal"]
    began_s: float
    ended_s: float
    value: str = ""  # a send's body; a fault's target
    stored: Stored | None = None  # a send's, when answered
    resent: bool = False  # sent again after a broken connection: it may be stored twice
    read: list[tuple[str, int, int, str]] = []  # (topic, queue, offset, value) a read saw
    epoch: int = 0  # an observation's: the engine (``value``) answered its route as master of this epoch
    error: str = ""


class History:
    """Thread-safe: many clients append at once."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._lock = threading.Lock()

    def add(self, op: Op) -> None:
        with self._lock:
            self.ops.append(op)

    def note(self, process: str, f: str, outcome: Literal["start", "heal"], value: str = "") -> None:
        now = time.monotonic()
        self.add(Op(process=process, f=f, outcome=outcome, began_s=now, ended_s=now, value=value))

    def snapshot(self) -> list[Op]:
        with self._lock:
            return list(self.ops)

    def save(self, path: Path) -> None:
        """As JSON lines, one operation a line, in the order they were added."""
        encoder = msgspec.json.Encoder()
        with open(path, "wb") as out:
            for op in self.snapshot():
                out.write(encoder.encode(op) + b"\n")


def load(path: Path) -> list[Op]:
    """A history ``History.save`` wrote."""
    decoder = msgspec.json.Decoder(Op)
    with open(path, "rb") as lines:
        return [decoder.decode(line) for line in lines if line.strip()]
