"""The wire between the actors, declared once: every channel, who binds it, who connects, and the
message types that cross it each way.

The runtime (``engine/actors/base.py``) opens an actor's sockets from these declarations and
decodes every message it takes against its channel (``engine/ipc/wire.py``); the simulation
(``harness/simulation``) carries messages over the same declarations and checks each one, so a
message that a channel does not declare is a failed assertion in both. ``docs/design.md`` §1.2
holds the table this module prints (``python -m engine.ipc.channels``); a test fails when they
differ.

Patterns:

* ``request``: a ROUTER bound by the server, DEALERs connected by its clients. What a DEALER
  sends is ``ask``; what the ROUTER answers is ``answer``.
* ``publish``: a PUB bound by the publisher, SUBs connected by the subscribers, each on the
  ``topics`` it names. What goes out is ``answer`` (``ask`` is empty).
* ``push``: PUSH sockets of every actor into the supervisor's PULL (``ask`` only).

``ClientFrame`` stands for a frame of the client protocol (``engine/ipc/protocol.py``): a
msgpack map with ``op`` and ``id``, which the engine forwards without decoding its body.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace

from engine.ipc import endpoints
from engine.ipc.messages import (
    Ack,
    Append,
    ChangeInvisible,
    ConfigSnapshot,
    ConfirmOffset,
    ControlReply,
    ControlRequest,
    DeleteTopic,
    DispatchBatch,
    EndTransaction,
    Event,
    FlushFailed,
    GetById,
    GetByOffset,
    Heartbeat,
    LogChunk,
    MasterEndpoint,
    OffsetForTime,
    Pop,
    PopElsewhere,
    PopStats,
    Pull,
    QueueStats,
    ReplicaAppend,
    ReplicaAppended,
    ReplicaDeletions,
    ReplicaRefused,
    ReplicaReport,
    TopicDeletion,
    TransactionChecks,
    Wake,
)


class ClientFrame:
    """A client-protocol frame (``engine/ipc/protocol.py``), passed on as it came."""


REQUEST, PUBLISH, PUSH = "request", "publish", "push"
CLIENT_ENDPOINT = "<config.endpoint>"  # the front's client endpoint, from the settings
REPLICATION_ENDPOINT = "<config.replication_endpoint>"  # a master's, from its settings (a replica's replica_of)
DIRECT_REPLIES_ENDPOINT = "<the front's host, a port of the system>"  # engine/ipc/direct_replies.py


@dataclass(frozen=True, eq=False)  # one object per channel: compared and hashed by identity
class Channel:
    """One socket pattern between actors. ``name`` is the port's name on both sides."""

    name: str
    pattern: str  # REQUEST, PUBLISH or PUSH
    endpoint: str  # a file of the run directory (``endpoints``), or CLIENT_ENDPOINT
    binder: str  # the actor that binds it
    peers: tuple[str, ...]  # the actors that connect to it
    ask: tuple[type, ...]  # peer -> binder; with ``Routed``: the orders it may carry
    answer: tuple[type, ...]  # binder -> peer; with ``Answered``: the notes it may carry
    topics: tuple[bytes, ...] = ()  # PUBLISH: the topics published
    framed: bool = False  # REQUEST: a ``Routed`` envelope and a client frame each way (else one frame)
    meaning: str = ""

    @property
    def routed(self) -> bool:
        return self.framed

    def opened_by(self, actor: str, *, bind: bool) -> bool:
        """May ``actor`` (a name of ``engine/actors/specs.py``) open this end of the channel?"""
        kind = re.sub(r"-\d+$", "-<k>", actor)
        names = (kind, actor)
        return self.binder in names if bind else any(name in self.peers for name in names)

    def allows(self, body: object, *, asking: bool) -> bool:
        """Is ``body`` declared for this direction: a ``Routed``'s order, an ``Answered``'s note (None:
        a plain answer), a publication, a ``ClientFrame``?"""
        if body is None:
            return self.framed and not asking
        return type(body) in (self.ask if asking else self.answer)


_OWNER_ORDERS = (Pull, QueueStats, OffsetForTime, GetById, GetByOffset, Pop, Ack, ChangeInvisible, PopStats)

CLIENTS = Channel("clients", REQUEST, CLIENT_ENDPOINT, "front", ("client", "grpc"), (ClientFrame,), (ClientFrame,),
                  meaning="the client protocol; a REQ client's frames carry an empty delimiter")
FRONT_INTERNAL = Channel("front-internal", REQUEST, endpoints.FRONT_INTERNAL, "front", ("timer", "transactions"),
                         (ClientFrame,), (ClientFrame,),
                         meaning="the client protocol for the actors that read and write messages as clients do")
WRITER = Channel("writer", REQUEST, endpoints.WRITER, "writer", ("front", "owner-<k>", "replication-receiver"),
                 (Append, DeleteTopic, ReplicaAppend, ReplicaDeletions), (TopicDeletion, ReplicaAppended), framed=True,
                 meaning="sends and topic deletions; an owner's dead letters (``Append``); on a replica, the "
                         "master's log bytes and deletion table (``ReplicaAppend``, ``ReplicaDeletions``)")
TRANSACTIONS = Channel("transactions", REQUEST, endpoints.TRANSACTIONS, "transactions", ("front",),
                       (EndTransaction, TransactionChecks), (), framed=True,
                       meaning="producers' decisions and their checks")
CONFIRMED = Channel("confirmed", PUBLISH, endpoints.WRITER_PUB, "writer", ("reput", "replication-sender"), (), (Wake,),
                    topics=(endpoints.TOPIC_CONFIRMED,),
                    meaning="the confirmed offset moved; under SYNC_FLUSH, after each of the writer's own syncs")
FLUSHED = Channel("flushed", PUBLISH, endpoints.FLUSHER_PUB, "flusher", ("writer",), (), (Wake, FlushFailed),
                  topics=(endpoints.TOPIC_FLUSHED,),
                  meaning="the flushed offset moved, or a flush failed (ASYNC_FLUSH; the writer subscribes for "
                          "the failures)")
DISPATCH = Channel("dispatch", PUBLISH, endpoints.REPUT_PUB, "reput", ("owner-<k>", "index"), (), (DispatchBatch,),
                   topics=(b"cq.<k>.", endpoints.TOPIC_INDEX),
                   meaning="records of the log, per owner and for the index")
REPLICATION = Channel("replication", REQUEST, REPLICATION_ENDPOINT, "replication-sender", ("replication-receiver",),
                      (ReplicaReport,), (LogChunk, ConfigSnapshot, MasterEndpoint, ConfirmOffset, ReplicaRefused),
                      framed=True,
                      meaning="between engines, over tcp: a replica's reports of its log's end; its master's log "
                              "bytes from there, and its config files")
REPLICATED = Channel("replicated", PUBLISH, endpoints.REPLICATION_PUB, "replication-sender", ("writer",), (),
                     (Wake,), topics=(endpoints.TOPIC_REPLICATED,),
                     meaning="what the in-sync replicas hold, or how many are in sync, changed (SYNC replication)")
HEARTBEATS = Channel("heartbeats", PUSH, endpoints.SUPERVISOR_HEARTBEATS, "supervisor", ("every actor",),
                     (Heartbeat,), (), meaning="lifecycle and figures, every heartbeat_interval_ms")
CONTROL = Channel("control", REQUEST, endpoints.SUPERVISOR_CONTROL, "supervisor", ("CLI", "tests", "membership"),
                  ControlRequest.__args__, (ControlReply,),
                  meaning="status, stop, kill; the role the broker membership actor holds, taken or changed "
                          "(``RoleChanged``)")
EVENTS = Channel("events", PUBLISH, endpoints.SUPERVISOR_EVENTS, "supervisor", ("CLI", "tests"), (), (Event,),
                 topics=(endpoints.TOPIC_EVENT,), meaning="lifecycle news")


OWNER = Channel("owner-<k>", REQUEST, "owner-<k>.sock", "owner-<k>", ("front",),
                _OWNER_ORDERS, (PopElsewhere,), framed=True,
                meaning="reads, pops and acks of the queues owner k holds; a pop passed on comes back as "
                        "``PopElsewhere``")
_owners: dict[int, Channel] = {}


def owner(instance: int) -> Channel:
    """The requests channel of ConsumeQueue owner ``instance``."""
    channel = _owners.get(instance)
    if channel is None:
        channel = _owners[instance] = replace(OWNER, name=f"owner-{instance}", binder=f"owner-{instance}",
                                              endpoint=endpoints.owner_endpoint_name(instance))
    return channel


REPLIES = Channel("replies-<actor>", REQUEST, DIRECT_REPLIES_ENDPOINT, "writer, owner-<k>", ("client",),
                  (ClientFrame,), (ClientFrame,),
                  meaning="an actor's answers straight to a client connected to it under the routing id it gives "
                          "the front (``direct_replies_enabled``, ``engine/ipc/direct_replies.py``); the writer's "
                          "also takes sends (``direct_sends_enabled``, ``engine/services/writer/direct_sends.py``), "
                          "and the client sends nothing to the others")
_replies: dict[str, Channel] = {}


def replies(actor: str) -> Channel:
    """The channel on which ``actor`` (the writer, an owner) answers clients directly."""
    channel = _replies.get(actor)
    if channel is None:
        channel = _replies[actor] = replace(REPLIES, name=f"replies-{actor}", binder=actor)
    return channel


CHANNELS = (CLIENTS, FRONT_INTERNAL, WRITER, OWNER, REPLIES, TRANSACTIONS, CONFIRMED, FLUSHED, DISPATCH,
            REPLICATION, REPLICATED, HEARTBEATS, CONTROL, EVENTS)

_KINDS = {REQUEST: ("ROUTER", "DEALER"), PUBLISH: ("PUB", "SUB"), PUSH: ("PULL", "PUSH")}


def _names(types: tuple[type, ...]) -> str:
    return ", ".join(f"`{t.__name__}`" for t in types) or "—"


def table() -> str:
    """The channel table of ``docs/design.md`` §1.2, in Markdown."""
    lines = ["| Channel | Binds | Connects | Endpoint | Peer → binder | Binder → peer | Meaning |",
             "|---|---|---|---|---|---|---|"]
    for channel in CHANNELS:
        bind_kind, peer_kind = _KINDS[channel.pattern]
        ask, answer = _names(channel.ask), _names(channel.answer)
        if channel.framed:
            ask, answer = f"`Routed` of {ask}, client frame", f"`Answered` (note: {answer}), client frame"
        topics = f" topics {', '.join(f'`{t.decode()}`' for t in channel.topics)}" if channel.topics else ""
        meaning = channel.meaning.replace("``", "`")
        lines.append(f"| `{channel.name}` | {channel.binder} ({bind_kind}) | {', '.join(channel.peers)} "
                     f"({peer_kind}) | `{channel.endpoint}`{topics} | {ask} | {answer} | {meaning} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table())
