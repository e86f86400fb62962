"""Every internal message between actors, as typed msgspec Structs.

Bodies never cross these sockets: what moves is offsets and small metadata;
message bytes stay in the mmap'd CommitLog. Client frames are forwarded
as they came (see ``protocol.py``) with a ``Route`` frame beside them.

Each docstring says sender -> receiver, the socket pattern and the reply.
"""

from __future__ import annotations

import msgspec


class Route(msgspec.Struct, array_like=True):
    """front -> writer / owner / index, beside a forwarded client frame.

    ``queue_id`` is the queue the front chose for a send (-1 elsewhere).
    No reply of its own: the backend answers the client frame.
    """

    queue_id: int = -1
    received_ms: int = 0  # when the front received the request (monotonic ms): sends that waited too long are refused


class Confirmed(msgspec.Struct, array_like=True, tag="confirmed"):
    """writer -> reput, flusher, owners (PUB ``confirmed``), after every append and every tick.

    Complete records lie below ``confirmed_offset``. ``min_offset`` is the
    start of the oldest segment. Also sent periodically for late joiners.
    """

    confirmed_offset: int
    min_offset: int
    last_store_timestamp: int  # store time of the last confirmed record, ms


class Flushed(msgspec.Struct, array_like=True, tag="flushed"):
    """flusher -> writer, reput (PUB ``flushed``): the log is on disk below ``flushed_offset``."""

    flushed_offset: int


class FlushFailed(msgspec.Struct, array_like=True, tag="flush_failed"):
    """flusher -> writer (PUB ``flushed``): a flush failed; the flusher exits after sending this."""

    reason: str


class DispatchEntry(msgspec.Struct, array_like=True):
    """One record as the reput dispatcher found it in the log."""

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

    Covers the log range [start, end): ``entries`` are every record in it
    for the receiver. An empty batch is a tick. A receiver whose own progress
    is below ``start`` has missed a batch and reads the gap from the log itself.
    """

    start: int
    end: int
    entries: list[DispatchEntry]


class Heartbeat(msgspec.Struct, array_like=True, tag="heartbeat"):
    """every actor -> supervisor (PUSH), every ``heartbeat_interval_ms``."""

    name: str
    pid: int
    lifecycle: str
    detail: dict[str, int]


class ControlRequest(msgspec.Struct, tag="control"):
    """CLI / tests -> supervisor (DEALER to ROUTER). Reply: ``ControlReply``.

    ``command``: ``status``, ``stop``, ``kill`` (``name`` of an actor).
    """

    command: str
    name: str = ""


class ActorStatus(msgspec.Struct):
    name: str
    pid: int
    lifecycle: str
    restarts: int
    detail: dict[str, int]


class ControlReply(msgspec.Struct, tag="control_reply"):
    ok: bool
    message: str = ""
    state: str = ""
    endpoint: str = ""
    actors: list[ActorStatus] = []


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
route_decoder = msgspec.msgpack.Decoder(Route)
offsets_decoder = msgspec.msgpack.Decoder(Confirmed | Flushed | FlushFailed)
dispatch_decoder = msgspec.msgpack.Decoder(DispatchBatch)
heartbeat_decoder = msgspec.msgpack.Decoder(Heartbeat)
control_request_decoder = msgspec.msgpack.Decoder(ControlRequest)
control_reply_decoder = msgspec.msgpack.Decoder(ControlReply)
event_decoder = msgspec.msgpack.Decoder(Event)
