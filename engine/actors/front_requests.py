"""An actor as a client of the front: requests in the client protocol on the front's internal
port (the ``front-internal`` channel), each with an id, a deadline and what to do with the reply.

The timer and the transaction actor read and write messages the way any client does, so
every check of the front and the writer applies to them too. A request the port could not
send (the front is down or not yet connected: the port queues nothing for a missing peer) is
sent again at each ``expire`` until its deadline; one that gets no reply by its deadline, or
that the front held when the connection broke, is handed back with ``None`` for a reply: its
outcome is unknown (or, unsent, it was not done).

Requests are the protocol's request structs (``SendRequest``, ``PullRequest``), replies are
decoded into its reply structs (``SendReply``, ``PullReply``: the fields the engine sends,
any other ignored). A reply that does not read as its struct is handed back as ``None`` too.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

import msgspec

from engine.actors.base import Clock, Port
from engine.actors.effects import Effects, Tell
from engine.ipc import channels
from engine.ipc.protocol import MessageView, PullReply, PullRequest, Reply, SendReply, SendRequest

log = logging.getLogger(__name__)
R = TypeVar("R", bound=Reply)
_encoder = msgspec.msgpack.Encoder()
_head_decoder = msgspec.msgpack.Decoder(Reply)  # the id, to find the request; then its own decoder
_send_decoder = msgspec.msgpack.Decoder(SendReply)
_pull_decoder = msgspec.msgpack.Decoder(PullReply)


def front_port() -> Port:
    """Monitored: when the front goes, the requests it held are handed back at once (``lost``)."""
    return Port(channels.FRONT_INTERNAL, bind=False, immediate=True, reconnect_ivl_ms=10, monitor=True)


@dataclass
class _Pending(Generic[R]):
    deadline_ms: int
    frame: bytes  # the encoded request, to send again while the front is not connected
    decoder: msgspec.msgpack.Decoder[R]
    on_reply: Callable[[R | None, Effects], None]  # None: no reply (refused, or past its deadline)

    def answer(self, frame: bytes, out: Effects) -> None:
        try:
            reply = self.decoder.decode(frame)
        except (msgspec.DecodeError, ValueError, RecursionError) as exc:  # ValidationError is a DecodeError
            log.error("a reply of the front does not read as %s (%s): its outcome is unknown",
                      self.decoder.type.__name__, exc)
            self.on_reply(None, out)
            return
        self.on_reply(reply, out)


class FrontRequests:
    """The requests in flight to the front: each sent as its protocol struct with an id and a
    deadline, its reply decoded into the op's reply struct (``SendReply``, ``PullReply``)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        # ids unique across incarnations: a reply meant for the actor before a restart is never taken
        # for the answer to a request of this one
        self._ids = itertools.count((clock.wall_ms() << 20) + 1)
        self._pending: dict[int, _Pending[SendReply] | _Pending[PullReply]] = {}
        self._unsent: list[int] = []  # the port took nothing: sent again until the deadline
        self._lost: list[int] = []  # the front held them when its connection broke

    def __len__(self) -> int:
        return len(self._pending)

    def send(self, out: Effects, request: SendRequest, on_reply: Callable[[SendReply | None, Effects], None], *,
             timeout_ms: int) -> None:
        frame = self._stamp(request)
        self._add(out, request.id, _Pending(self.clock.mono_ms() + timeout_ms, frame, _send_decoder, on_reply))

    def pull(self, out: Effects, request: PullRequest, on_reply: Callable[[PullReply | None, Effects], None], *,
             timeout_ms: int) -> None:
        frame = self._stamp(request)
        self._add(out, request.id, _Pending(self.clock.mono_ms() + timeout_ms, frame, _pull_decoder, on_reply))

    def _stamp(self, request: SendRequest | PullRequest) -> bytes:
        request.id = next(self._ids)
        return _encoder.encode(request)

    def _add(self, out: Effects, request_id: int, pending: _Pending[SendReply] | _Pending[PullReply]) -> None:
        self._pending[request_id] = pending
        self._tell(out, request_id, pending.frame)

    def _tell(self, out: Effects, request_id: int, frame: bytes) -> None:
        out.append(Tell(channels.FRONT_INTERNAL, None, frame, partial(self._unsent.append, request_id)))

    def handle_reply(self, frame: bytes, out: Effects) -> None:
        try:
            head = _head_decoder.decode(frame)
        except (msgspec.DecodeError, ValueError, RecursionError):
            return  # not a reply map: no request can be told it was answered
        pending = self._pending.pop(head.id, None)
        if pending is not None:
            pending.answer(frame, out)

    def lost(self) -> None:
        """The connection to the front broke: no request it held will be answered."""
        self._lost.extend(self._pending)

    def expire(self, out: Effects) -> None:
        """Hand back, with no reply, the requests lost or past their deadline; send again the
        ones the port could not send."""
        now = self.clock.mono_ms()
        gone = self._lost + [rid for rid, pending in self._pending.items() if pending.deadline_ms <= now]
        self._lost = []
        for request_id in gone:
            pending = self._pending.pop(request_id, None)
            if pending is not None:
                pending.on_reply(None, out)
        unsent, self._unsent = self._unsent, []
        for request_id in unsent:
            pending = self._pending.get(request_id)
            if pending is not None:
                self._tell(out, request_id, pending.frame)


class QueueFollower:
    """Reads one queue from an offset on, a long-polled pull at a time, handing each batch of
    messages to ``on_messages``."""

    def __init__(self, front: FrontRequests, topic: str, next_offset: int, *, wait_ms: int = 1_000,
                 messages_max: int = 256) -> None:
        self.front = front
        self.topic = topic
        self.next_offset = next_offset
        self.wait_ms = wait_ms
        self.messages_max = messages_max
        self.pulling = False

    def pull(self, out: Effects, on_messages: Callable[[list[MessageView], Effects], None]) -> None:
        if self.pulling:
            return
        self.pulling = True

        def on_reply(reply: PullReply | None, later: Effects) -> None:
            self.pulling = False
            if reply is None or not reply.ok:
                return  # pulled again at the next tick
            messages = reply.messages
            if messages:
                self.next_offset = messages[-1].queue_offset + 1
            elif reply.next_offset is not None and reply.next_offset > self.next_offset:
                self.next_offset = reply.next_offset  # past entries retention removed
            on_messages(messages, later)

        self.front.pull(out, PullRequest(op="pull", topic=self.topic, queue_id=0, offset=self.next_offset,
                                         max_messages=self.messages_max, max_wait_ms=self.wait_ms),
                        on_reply, timeout_ms=self.wait_ms + 2_000)
