"""An actor as a client of the front: requests in the client protocol on the front's internal
port (``endpoints.FRONT_INTERNAL``), each with an id, a deadline and what to do with the reply.

The timer and the transaction actor read and write messages the way any client does, so
every check of the front and the writer applies to them too. A request the front cannot
take (it is down: the port queues nothing for a missing peer) or that gets no reply by its
deadline is handed back with ``None`` for a reply: its outcome is unknown.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec

from engine.actors.base import Clock, Port
from engine.actors.effects import Effects, Tell
from engine.ipc import channels
from engine.ipc.protocol import encode_request

Reply = dict[str, Any] | None  # None: no reply (refused, or past its deadline)
_decoder = msgspec.msgpack.Decoder()


def front_port() -> Port:
    """Monitored: when the front goes, the requests it held are handed back at once (``lost``)."""
    return Port(channels.FRONT_INTERNAL, bind=False, immediate=True, reconnect_ivl_ms=10, monitor=True)


@dataclass
class _Pending:
    deadline_ms: int
    on_reply: Callable[[Reply, Effects], None]


class FrontRequests:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        # ids unique across incarnations: a reply meant for the actor before a restart is never taken
        # for the answer to a request of this one
        self._ids = itertools.count((clock.wall_ms() << 20) + 1)
        self._pending: dict[int, _Pending] = {}
        self._refused: list[int] = []

    def __len__(self) -> int:
        return len(self._pending)

    def send(self, out: Effects, op: str, on_reply: Callable[[Reply, Effects], None], *, timeout_ms: int,
             **fields: object) -> None:
        request_id = next(self._ids)
        self._pending[request_id] = _Pending(self.clock.mono_ms() + timeout_ms, on_reply)
        out.append(Tell(channels.FRONT_INTERNAL, None, encode_request(op, request_id, **fields),
                        partial(self._refuse, request_id)))

    def _refuse(self, request_id: int) -> None:
        self._refused.append(request_id)

    def handle_reply(self, frame: bytes, out: Effects) -> None:
        try:
            reply = _decoder.decode(frame)
        except msgspec.DecodeError:
            return
        pending = self._pending.pop(reply.get("id", 0), None) if isinstance(reply, dict) else None
        if pending is not None:
            pending.on_reply(reply, out)

    def lost(self) -> None:
        """The connection to the front broke: no request it held will be answered."""
        self._refused.extend(self._pending)

    def expire(self, out: Effects) -> None:
        """Hand back, with no reply, the requests refused or past their deadline."""
        now = self.clock.mono_ms()
        gone = self._refused + [rid for rid, pending in self._pending.items() if pending.deadline_ms <= now]
        self._refused = []
        for request_id in gone:
            pending = self._pending.pop(request_id, None)
            if pending is not None:
                pending.on_reply(None, out)


class QueueFollower:
    """Reads one queue from an offset on, a long-polled pull at a time, handing each batch of
    messages to ``on_messages`` (which says whether it took them: False leaves the offset)."""

    def __init__(self, front: FrontRequests, topic: str, next_offset: int, *, wait_ms: int = 1_000,
                 messages_max: int = 256) -> None:
        self.front = front
        self.topic = topic
        self.next_offset = next_offset
        self.wait_ms = wait_ms
        self.messages_max = messages_max
        self.pulling = False

    def pull(self, out: Effects, on_messages: Callable[[list[dict[str, Any]], Effects], None]) -> None:
        if self.pulling:
            return
        self.pulling = True

        def on_reply(reply: Reply, later: Effects) -> None:
            self.pulling = False
            if reply is None or not reply.get("ok"):
                return  # pulled again at the next tick
            messages = reply.get("messages", [])
            if messages:
                self.next_offset = messages[-1]["queue_offset"] + 1
            elif reply.get("next_offset", self.next_offset) > self.next_offset:
                self.next_offset = reply["next_offset"]  # past entries retention removed
            on_messages(messages, later)

        self.front.send(out, "pull", on_reply, timeout_ms=self.wait_ms + 2_000, topic=self.topic, queue_id=0,
                        offset=self.next_offset, max_messages=self.messages_max, max_wait_ms=self.wait_ms)
