"""Every internal message between actors, as typed msgspec Structs.

Bodies never cross these sockets: what moves is offsets and small metadata;
message bytes stay in the mmap'd CommitLog. Between engines it is the other way: a
master ships its log's bytes to its replicas (``LogChunk``), as RocketMQ's HA does. A client request is forwarded as
it came (see ``protocol.py``), behind a typed envelope, ``Routed``, whose
``order`` says what the receiver is asked to do; the answer comes back behind
an ``Answered``. The receiver's handler is chosen by the order's type, never by
a string. Which channel carries which message, each way, is declared in
``engine/ipc/channels.py``; the frames are laid out in one place,
``engine/ipc/wire.py``.

Facts that only grow (how far the log is confirmed, flushed, applied) travel
in the shared offset slots (``engine/store/shared_offsets.py``); a ``Wake``
only tells readers to look at them again. ``docs/design.md`` has the table of
facts and channels.

Each docstring says sender -> receiver, the socket pattern and the reply.
"""

from __future__ import annotations

import msgspec

from engine.ipc.lifecycle import Lifecycle

# -- front -> writer ------------------------------------------------------------------------------


class Append(msgspec.Struct, array_like=True, tag="append"):
    """front -> writer: append the batch of the client ``send`` request behind this envelope.

    ``queue_id`` is the queue the front chose (given, by sharding key or round robin);
    ``received_ms`` is when the front received it (monotonic ms): a send that waited in the
    writer's queue longer than ``send_queue_wait_ms_max`` is refused with BUSY.
    ``internal``: it came from an actor (the timer, the transaction actor) on the front's
    internal port, and may carry the routing properties (``engine/store/system_topics.py``).
    ``born_ip``: the client's IP, 4 bytes (IPv4) or 16 (IPv6), which the records get as their
    BORNHOST, with port 0 (ZeroMQ does not tell the peer's port); b"" when the client has no
    IP address (ipc://, an actor): BORNHOST is then the store host, as STOREHOST.
    Reply: the client reply (results, or an error).
    """

    queue_id: int
    received_ms: int
    internal: bool = False
    born_ip: bytes = b""


class DeleteTopic(msgspec.Struct, array_like=True, tag="delete_topic"):
    """front -> writer: decide where the deletion of the request's topic falls in the log.

    Reply: the client reply, then a ``TopicDeletion`` frame for the front.
    """


class ReplicaAppend(msgspec.Struct, array_like=True, tag="replica_append"):
    """replication receiver -> writer (a replica's): append the log bytes of the frame after this at
    ``offset``, which must be where the log ends (whole records: ``LogChunk``), and only while the
    replica's deletion table is the one the master had sent them with (``deletions_crc``).
    Reply: ``ReplicaAppended`` with the log's end after it (an empty frame)."""

    offset: int
    deletions_crc: int = 0
    epoch: int = 0  # elected on etcd: the epoch of the follow that brought it (the writer refuses another's)


class ReplicaDeletions(msgspec.Struct, array_like=True, tag="replica_deletions"):
    """replication receiver -> writer (a replica's): the master's ``config/deletedTopics.json``, in the
    frame after this, replaces the replica's before the log bytes that follow it.
    Reply: ``ReplicaAppended`` with the log's end (an empty frame)."""

    epoch: int = 0  # as ``ReplicaAppend.epoch``


WriterRequest = Append | DeleteTopic | ReplicaAppend | ReplicaDeletions


class ReplicaAppended(msgspec.Struct, array_like=True, tag="replica_appended"):
    """writer -> replication receiver, beside an empty frame: the replica's log now ends at
    ``end_offset``. ``refused``: why the bytes were not appended ("" when they were): they were
    not for the log's end (the receiver then reports that end to its master, which sends from it)."""

    end_offset: int
    refused: str = ""


class TopicDeletion(msgspec.Struct, array_like=True, tag="topic_deletion"):
    """writer -> front, beside the reply to a ``DeleteTopic``.

    ``recorded``: the deletion is in ``config/deletedTopics.json`` on disk, and the front
    drops the topic from its table and its groups' offsets; False: nothing changed.
    """

    topic: str
    recorded: bool


# -- front -> ConsumeQueue owner ------------------------------------------------------------------


class Pull(msgspec.Struct, array_like=True, tag="pull"):
    """front -> owner of (topic, queue): serve the client ``pull`` behind this envelope.

    Reply: the client reply, at once or, for a long poll, when a message arrives or the wait ends.
    """


class QueueStats(msgspec.Struct, array_like=True, tag="queue_stats"):
    """front -> owner of (topic, queue): the queue's offsets and store times. Reply: the client reply."""


class OffsetForTime(msgspec.Struct, array_like=True, tag="offset_for_time"):
    """front -> owner of (topic, queue): the first offset stored at or after a time. Reply: the client reply."""


class GetById(msgspec.Struct, array_like=True, tag="get_by_id"):
    """front -> the owner chosen by the id's segment: read one record by message id."""


class GetByOffset(msgspec.Struct, array_like=True, tag="get_by_offset"):
    """front -> the owner chosen by the offset's segment, as for ``GetById``: read one record by CommitLog offset."""


class Pop(msgspec.Struct, array_like=True, tag="pop"):
    """front -> an owner: serve the client ``pop`` from ``queue_ids`` (the request's queue, or
    every queue of the topic this owner holds). Reply: the client reply, at once or (long
    polling) when a message arrives or becomes due again, or when the wait ends.

    ``then``: the other owners holding queues of the topic, (owner, its queue ids), to try in
    turn. An owner that finds nothing to deliver now, with ``then`` left, neither answers nor
    parks the pop: it hands it back to the front with a ``PopElsewhere`` frame. So a pop finds
    a message in any queue of the topic, and only the last owner tried waits for one."""

    queue_ids: list[int]
    then: list[tuple[int, list[int]]] = []


class PopElsewhere(msgspec.Struct, array_like=True, tag="pop_elsewhere"):
    """owner -> front, in place of a reply: nothing to pop here; forward the pop to ``then[0]``."""

    then: list[tuple[int, list[int]]]


class Ack(msgspec.Struct, array_like=True, tag="ack"):
    """front -> owner of (topic, queue): acknowledge the client ``ack``'s receipt handles."""


class ChangeInvisible(msgspec.Struct, array_like=True, tag="change_invisible"):
    """front -> owner of (topic, queue): change one delivery's invisible time (0: a nack)."""


class PopStats(msgspec.Struct, array_like=True, tag="pop_stats"):
    """front -> owner of (topic, queue): a pop group's ack floor and counts on the queue."""


OwnerRequest = Pull | QueueStats | OffsetForTime | GetById | GetByOffset | Pop | Ack | ChangeInvisible | PopStats

# -- front -> transaction actor ------------------------------------------------------------------


class EndTransaction(msgspec.Struct, array_like=True, tag="end_transaction"):
    """front -> transaction actor: decide the half message of the client ``end_transaction``.
    Reply: the client reply, once the decision (and, for a commit, the message) is stored."""


class TransactionChecks(msgspec.Struct, array_like=True, tag="transaction_checks"):
    """front -> transaction actor: the client ``transaction_checks`` (a producer asking which of its
    group's half messages wait for a decision). Reply: the client reply, at once or (long polling)
    when a check falls due or the wait ends."""


TransactionRequest = EndTransaction | TransactionChecks

# -- replica -> master (replication, between engines) ----------------------------------------------


class ReplicaReport(msgspec.Struct, array_like=True, tag="replica_report"):
    """replication receiver (a replica's) -> replication sender (its master's), over tcp: my log
    ends at ``end_offset`` (all of it written). ``restart``: send from there, forgetting what is in
    flight (a new connection, or bytes the replica's writer refused), the config files first, as
    follow number ``follow``, which every answer carries (the receiver drops those of an older
    one); else the report is progress. Replies: ``LogChunk``s from the replica's end
    (``ReplicaRefused`` when the master cannot)."""

    end_offset: int
    restart: bool = False
    follow: int = 0
    epoch: int = 0  # elected on etcd: the epoch the replica follows (a master of an older one refuses it)
    broker_id: int = -1  # elected on etcd: the replica's, for the in-sync set in etcd


ReplicationRequest = ReplicaReport
Order = WriterRequest | OwnerRequest | TransactionRequest | ReplicationRequest


class LogChunk(msgspec.Struct, array_like=True, tag="log_chunk"):
    """replication sender -> receiver, beside the log bytes from ``offset``: whole records (a
    segment's blank tail whole), never across a segment's end. ``master_end_offset``: how far the
    master's log is confirmed, for the replica's lag; ``follow``: the report it answers;
    ``deletions_crc``: of the deletion table the master sent before it (``DeletedTopics.crc``)."""

    offset: int
    master_end_offset: int
    follow: int = 0
    deletions_crc: int = 0
    epoch: int = 0  # elected on etcd: the master's (a replica of a newer one drops it)
    epoch_start: int = 0  # where that epoch began in the set's log (RocketMQ's epochStartOffset)


class ConfigSnapshot(msgspec.Struct, array_like=True, tag="config_snapshot"):
    """replication sender -> receiver, beside a file's bytes: the master's ``config/<name>`` (the
    topics, the consumers' offsets, the deleted topics) as it is on disk now."""

    name: str
    follow: int = 0


class ConfirmOffset(msgspec.Struct, array_like=True, tag="confirm_offset"):
    """replication sender -> receiver, beside an empty frame, at each new follow and whenever it
    moves: how far every in-sync replica holds the master's log (RocketMQ's confirm offset). Under
    SYNC replication a replica's readers stop there too, so that no reader anywhere sees a record a
    failover could take back."""

    offset: int
    follow: int = 0


class MasterEndpoint(msgspec.Struct, array_like=True, tag="master_endpoint"):
    """replication sender -> receiver, beside an empty frame, at each new follow: the endpoint the
    master's clients reach (``store_host`` and ``store_port``, as RocketMQ advertises brokerIP1),
    which the replica's ``NOT_MASTER`` refusals name."""

    endpoint: str
    follow: int = 0


class ReplicaRefused(msgspec.Struct, array_like=True, tag="replica_refused"):
    """replication sender -> receiver, beside an empty frame: the master cannot follow the replica's
    report (its log ends past the master's, or starts below the master's oldest segment)."""

    reason: str

# -- the envelopes ---------------------------------------------------------------------------------

# How the client framed its request: DEALER, REQ, an actor on the internal port, or a client that chose
# its own routing id (ZeroMQ's own begin with a 0 byte): the one an actor may answer directly
# (``engine/ipc/direct_replies.py``).
PLAIN, REQ, INTERNAL, DIRECT = 0, 1, 2, 3


class Routed(msgspec.Struct, array_like=True, tag="routed"):
    """front (an owner, for its dead letters) -> writer, owner or transaction actor (DEALER to ROUTER),
    before the client's request frame: do ``order`` with it, for ``client``.

    ``client`` and ``flag`` say whom the front answers, and how it frames the answer
    (``PLAIN``: a DEALER client; ``REQ``: with the empty delimiter; ``INTERNAL``: on the internal
    port). The receiver gives both back in its ``Answered``.
    """

    client: bytes
    flag: int
    order: Order


Note = (TopicDeletion | PopElsewhere | ReplicaAppended | LogChunk | ConfigSnapshot | MasterEndpoint | ConfirmOffset
        | ReplicaRefused)


class Answered(msgspec.Struct, array_like=True, tag="answered"):
    """writer, owner or transaction actor -> its requester, before the client reply frame: the
    answer to a ``Routed`` for ``client``. ``note`` is for the requester itself: the writer's
    ``TopicDeletion``; an owner's ``PopElsewhere``, when the frame after it is the client's pop,
    handed back."""

    client: bytes
    flag: int
    note: Note | None = None


# -- progress of the log --------------------------------------------------------------------------


class Wake(msgspec.Struct, array_like=True, tag="wake"):
    """writer -> reput, flusher (PUB ``confirmed``) after appends and every tick;
    flusher -> writer, reput (PUB ``flushed``) after every flush.

    Carries no offset: the receiver reads the slots it follows (confirmed, min offset and
    last store time; or flushed) from the shared offsets, which the sender wrote first.
    """


class FlushFailed(msgspec.Struct, array_like=True, tag="flush_failed"):
    """flusher -> writer (PUB ``flushed``): a flush failed; the flusher exits after sending this."""

    reason: str


class DispatchEntry(msgspec.Struct, array_like=True):
    """One record as the reput dispatcher found it in the log (in a ``DispatchBatch`` packed:
    ``codec_py.PACKED_ENTRY``)."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    keys: list[str]  # user keys plus UNIQ_KEY, for the index; empty for queue owners


class DispatchBatch(msgspec.Struct, array_like=True, tag="dispatch"):
    """reput -> owner k (PUB ``cq.<k>``) and index builder (PUB ``ix``).

    Covers the log range [start, end): ``packed`` holds every record in it for
    the receiver, as ``DispatchEntry``s packed one after another
    (``codec_py.PACKED_ENTRY``): the receivers' C codec reads them where they lie,
    with no object a record. An empty batch is a tick. A receiver whose own progress
    is below ``start`` has missed a batch and reads the gap from the log itself.
    """

    start: int
    end: int
    packed: bytes


class Heartbeat(msgspec.Struct, array_like=True, tag="heartbeat"):
    """every actor -> supervisor (PUSH), every ``heartbeat_interval_ms``."""

    name: str
    pid: int
    lifecycle: Lifecycle
    detail: dict[str, int]
    condition: str = ""  # why a RUNNING actor cannot do its work ("" when it can): the engine is DEGRADED


class StatusQuery(msgspec.Struct, tag="status"):
    """CLI / tests -> supervisor (DEALER to ROUTER): every actor's state. Reply: ``ControlReply``."""


class StopCommand(msgspec.Struct, tag="stop"):
    """CLI / tests -> supervisor: stop the engine in order. Reply: ``ControlReply``."""


class KillCommand(msgspec.Struct, tag="kill"):
    """tests / fault scripts -> supervisor: SIGKILL the actor ``name``. Reply: ``ControlReply``."""

    name: str


class RoleChanged(msgspec.Struct, tag="role_changed"):
    """broker membership -> supervisor: the role the engine holds in its broker set now (the fields of
    ``engine/coordination/role.py``'s ``Role``, also in ``role.json``): the first completes the
    start, a later one starts the other actors again in it; the same role again changes nothing.
    Reply: ``ControlReply``."""

    role: str
    epoch: int
    master_id: int
    master_endpoint: str = ""
    master_replication_endpoint: str = ""
    history: list[tuple[int, int]] = []
    master_grpc_endpoint: str = ""


ControlRequest = StatusQuery | StopCommand | KillCommand | RoleChanged


class ActorStatus(msgspec.Struct):
    name: str
    pid: int
    lifecycle: Lifecycle
    restarts: int
    detail: dict[str, int]
    condition: str = ""  # the actor's last heartbeat's (``Heartbeat.condition``)


class ControlReply(msgspec.Struct, tag="control_reply"):
    """supervisor -> CLI / tests. ``state``, ``endpoint``, ``actors`` and ``offsets`` (the shared
    offset slots by name) answer a ``StatusQuery``; ``message`` says what a command did or why not.
    ``state`` is RUNNING, or DEGRADED with ``reasons``: each actor that does not run
    ("front DOWN"), each that runs but reports a condition ("writer: cannot append: ...")."""

    ok: bool
    message: str = ""
    state: str = ""
    endpoint: str = ""
    actors: list[ActorStatus] = []
    offsets: dict[str, int] = {}
    reasons: list[str] = []


class Event(msgspec.Struct, tag="event"):
    """supervisor -> anyone (PUB ``event``): lifecycle news that tests and tools wait on.

    ``kind``: ``actor.started`` (spawned), ``recovery.done`` then ``actor.running``
    (its recovery finished and it serves), ``actor.exited`` (with ``exit_code``,
    negative for a signal), ``actor.restarted``, ``actor.gave_up`` (flapping:
    left down), ``engine.ready``, ``engine.stopping``, ``engine.stopped``.
    """

    kind: str
    name: str = ""
    pid: int = 0
    exit_code: int = 0
    time_ms: int = 0


encoder = msgspec.msgpack.Encoder()
routed_decoder = msgspec.msgpack.Decoder(Routed)
answered_decoder = msgspec.msgpack.Decoder(Answered)
heartbeat_decoder = msgspec.msgpack.Decoder(Heartbeat)
control_request_decoder = msgspec.msgpack.Decoder(ControlRequest)
control_reply_decoder = msgspec.msgpack.Decoder(ControlReply)
event_decoder = msgspec.msgpack.Decoder(Event)
