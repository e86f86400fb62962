"""The replication receiver: a replica's end of RocketMQ's HA (``DefaultHAClient``).

Connects to its master's ``replication_endpoint`` (``replica_of``) and reports where this
engine's log ends (``ReplicaReport``, with ``restart`` on each new connection); hands every
``LogChunk`` that comes back to the writer (``ReplicaAppend``: the writer stays the only
appender, and appends a chunk only at the log's end), and reports the end the writer
answers. The config files the master sends (``ConfigSnapshot``) replace this store's, which
the front reloads; the deletion table goes to the writer (``ReplicaDeletions``), in order
with the log bytes, since the records after a deletion start their queues again at 0. A
replica's own reput dispatches what is appended, so its queues and index are its own, built
from the same bytes.

A report goes out at least every ``replication_report_interval_ms``; one with ``restart``
(a new follow, numbered: what comes for an older one is dropped) when nothing came for that
long while the log is behind its master's (a chunk lost on the way), when an order could not
reach the writer (nothing after it may: the deletion table must come before the bytes past
it), or when the writer refused a chunk (not for its end, or sent with another deletion table).
"""

from __future__ import annotations

import logging

from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects, Tell
from engine.coordination.role import Role
from engine.ipc import channels
from engine.ipc.channels import Channel
from engine.ipc.endpoints import MASTER_ENDPOINT_FILE
from engine.ipc.messages import (
    PLAIN,
    Answered,
    ConfigSnapshot,
    ConfirmOffset,
    LogChunk,
    MasterEndpoint,
    ReplicaAppend,
    ReplicaAppended,
    ReplicaDeletions,
    ReplicaRefused,
    ReplicaReport,
    Routed,
)
from engine.ipc.wire import Inbound
from engine.logs import event
from engine.services.replication.log_shipping import SECRET_CONFIG_FILES, SHIPPED_CONFIG_FILES
from engine.store.atomic_file import write_atomically
from engine.store.deleted_topics import DELETED_TOPICS_FILE
from engine.store.epoch_file import add_epoch, load_epochs
from engine.store.shared_offsets import EPOCH, REPLICATED, WRITTEN

log = logging.getLogger(__name__)
# A receiver starts as its master is elected, before the master's sender listens: it tries again this
# often (ZMQ_RECONNECT_IVL; libzmq's 100 ms was a tenth of a second more on each failover)
MASTER_RECONNECT_IVL_MS = 20
_CONFIG_FILES = {path.name: path for path in SHIPPED_CONFIG_FILES + SECRET_CONFIG_FILES}


class ReplicationReceiverActor(Actor):
    """Takes ``Answered`` (``LogChunk``, ``ConfigSnapshot``, ``ReplicaRefused``) on ``replication`` and
    (``ReplicaAppended``) on ``writer``; gives ``ReplicaReport`` on ``replication`` and
    ``ReplicaAppend`` on ``writer``."""

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.master_end_offset = 0
        self.last_chunk_ms = self.clock.mono_ms()
        self.last_report_ms = 0
        self.refused = ""  # why the master refuses to be followed ("" while it is followed)
        self.follow = 0  # the number of the follow the last restart began
        self.follow_epoch = 0  # the epoch it began in: the writer appends nothing of an older one
        self.lost = False  # an order did not reach the writer: this follow is over
        self.chunks_appended = 0
        self.appends_refused = 0
        epochs = load_epochs(env.store_dir)
        self.last_epoch = epochs[-1][0] if epochs else 0

    def ports(self) -> list[Port]:
        return [Port(channels.REPLICATION, bind=False, address=self.config.replica_of, monitor=True, set_key=True,
                     reconnect_ivl_ms=MASTER_RECONNECT_IVL_MS,
                     max_message_bytes=self.config.client_frame_bytes_max + self.config.segment_size_bytes,
                     heartbeat_timeout_ms=self.config.replication_heartbeat_timeout_ms),
                Port(channels.WRITER, bind=False, immediate=True, reconnect_ivl_ms=10, await_peer=True)]

    def handlers(self) -> dict[type, Handler]:
        return {Answered: self.on_answer}

    def recover(self, out: Effects) -> None:
        self.report(out, restart=True)

    def connection(self, channel: Channel, up: bool) -> None:
        if channel is channels.REPLICATION and up:
            self.last_report_ms = 0  # the next tick reports, with restart: a new connection is a new follow

    def report(self, out: Effects, *, restart: bool) -> None:
        self.last_report_ms = self.clock.mono_ms()
        if restart:  # a new follow: what is still on its way from the last one is dropped
            self.follow += 1
            self.follow_epoch = self.slots.get(EPOCH)
            self.lost = False
        report = ReplicaReport(self.slots.get(WRITTEN), restart, self.follow, self.slots.get(EPOCH),
                               self.config.broker_id if self.config.elected else -1)
        out.append(Tell(channels.REPLICATION, Routed(b"", PLAIN, report), b"", lambda: None))

    def to_writer(self, order: ReplicaAppend | ReplicaDeletions, payload: bytes, out: Effects) -> None:
        """In order to the writer; one that does not get there (the writer is down) ends this follow:
        nothing after it may go, and the next tick follows again from the log's end."""
        if not self.lost:
            out.append(Tell(channels.WRITER, Routed(b"", PLAIN, order), payload, self.writer_missed))

    def writer_missed(self) -> None:
        self.lost = True
        self.last_report_ms = 0

    def on_answer(self, answer: Answered, inbound: Inbound, out: Effects) -> None:
        note = answer.note
        if isinstance(note, LogChunk | ConfigSnapshot | MasterEndpoint | ConfirmOffset) and note.follow != self.follow:
            return  # sent for an earlier follow
        if isinstance(note, ConfirmOffset):  # under SYNC replication this engine's readers stop there
            self.slots.set(REPLICATED, note.offset)
            return
        if isinstance(note, MasterEndpoint):
            path = self.env.run_dir / MASTER_ENDPOINT_FILE
            if not path.exists() or path.read_text() != note.endpoint:
                write_atomically(path, note.endpoint.encode())  # the front's NOT_MASTER names it
            return
        if isinstance(note, LogChunk) and not self.of_this_epoch(note, inbound.payload):
            return
        if isinstance(note, LogChunk):
            self.last_chunk_ms = self.clock.mono_ms()
            self.master_end_offset = note.master_end_offset
            self.refused = ""
            self.to_writer(ReplicaAppend(note.offset, note.deletions_crc, self.follow_epoch), inbound.payload, out)
        elif isinstance(note, ReplicaAppended):
            if note.refused:
                self.appends_refused += 1
                log.warning("the writer refused a chunk: %s; following again from %d", note.refused,
                            note.end_offset)
            else:
                self.chunks_appended += 1
            self.report(out, restart=bool(note.refused))
        elif isinstance(note, ConfigSnapshot) and note.name == DELETED_TOPICS_FILE.name:  # the writer's, in order
            self.to_writer(ReplicaDeletions(self.follow_epoch), inbound.payload, out)
        elif isinstance(note, ConfigSnapshot):
            relative = _CONFIG_FILES.get(note.name)
            if relative is not None:
                (self.env.store_dir / relative).parent.mkdir(parents=True, exist_ok=True)
                write_atomically(self.env.store_dir / relative, inbound.payload,
                                 mode=0o600 if relative in SECRET_CONFIG_FILES else 0o644)
        elif isinstance(note, ReplicaRefused):
            if note.reason != self.refused:
                log.error("the master refuses to be followed: %s", note.reason,
                          extra=event("replication.refused", reason=note.reason))
            self.refused = note.reason

    def of_this_epoch(self, chunk: LogChunk, payload: bytes | memoryview) -> bool:
        """Elected on etcd: a chunk from a master of an older epoch than this engine follows is dropped
        (fencing: that master lost its lease); the first bytes of a newer one are noted in the epoch
        file, at the offset the epoch began in the set's log, before they reach the log."""
        if not self.config.elected:
            return True
        epoch = self.slots.get(EPOCH)
        if chunk.epoch < epoch:
            self.refused = f"a chunk from a master of epoch {chunk.epoch} while this engine follows epoch {epoch}"
            return False
        if chunk.epoch > self.last_epoch:
            self.note_epochs(chunk.epoch, chunk.epoch_start, chunk.offset + len(payload))
        return True

    def note_epochs(self, epoch: int, epoch_start: int, end: int) -> None:
        """Every epoch up to the chunk's whose first bytes the chunk (up to ``end``) brings. A replica
        catching up across failovers it missed takes the bytes of several epochs from the last
        master: each is noted at its start in the set's history (the role the membership actor
        wrote), or its bytes would count as the older epoch's, and the next fork check would cut
        them (they are the set's, and may have been acknowledged)."""
        role = Role.load(self.env.run_dir)
        starts = dict(role.history) if role is not None else {}
        starts[epoch] = epoch_start
        for noted, start in sorted(starts.items()):
            if self.last_epoch < noted <= epoch and start < end:
                add_epoch(self.env.store_dir, noted, start)
                self.last_epoch = noted

    def tick(self, out: Effects) -> None:
        now_ms = self.clock.mono_ms()
        interval = self.config.replication_report_interval_ms
        if now_ms - self.last_report_ms < interval:
            return
        stalled = now_ms - self.last_chunk_ms >= interval and self.slots.get(WRITTEN) < self.master_end_offset
        self.report(out, restart=stalled or self.lost or self.last_report_ms == 0)

    def detail(self) -> dict[str, int]:
        return {"end_offset": self.slots.get(WRITTEN), "master_end_offset": self.master_end_offset,
                "lag_bytes": max(0, self.master_end_offset - self.slots.get(WRITTEN)),
                "chunks_appended": self.chunks_appended, "appends_refused": self.appends_refused}

    def condition(self) -> str:
        return f"the master refuses to be followed: {self.refused}" if self.refused else ""


if __name__ == "__main__":
    raise SystemExit(main(ReplicationReceiverActor))
