"""What an actor's logic asks of the world: the effects its handlers give back.

A handler never touches a socket: it appends effects to the ``Effects`` it is
handed, and the runtime (``engine/actors/base.py`` in a process, the
simulation in ``harness/simulation``) carries them out, in order, once the
handler returns, laying out their frames with ``engine/ipc/wire.py``. Slots of
the shared offsets and the clock are read (and slots written) through the
``Env`` the actor was built with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import msgspec

from engine.ipc.channels import Channel
from engine.ipc.messages import Note, Routed
from engine.ipc.wire import Origin


class Reply(NamedTuple):
    """Answer the request that came from ``origin`` with the client frame ``payload`` (and, on a
    routed channel, a ``note`` for the requester itself)."""

    origin: Origin
    payload: bytes
    note: Note | None = None


class Tell(NamedTuple):
    """Send a request on ``channel`` (the actor is one of its peers) without waiting: ``routed`` (None
    on a client channel) and the client frame ``payload``. When the server's queue is full or it is
    not connected, carry out what ``refused()`` gives instead (the client's error reply, built only
    then; None: nothing)."""

    channel: Channel
    routed: Routed | None
    payload: bytes
    refused: Callable[[], Reply | None]


class Publish(NamedTuple):
    """Publish ``body`` on ``channel`` under ``topic``; ``body`` may come encoded already."""

    channel: Channel
    topic: bytes
    body: msgspec.Struct | bytes


class Exit(NamedTuple):
    """End the process now with ``code``, without a clean shutdown (fail-stop): the effects
    before it are carried out first, and their sends get a moment to leave."""

    code: int
    reason: str


Effect = Reply | Tell | Publish | Exit


class Effects(list[Effect]):
    """The effects of one handler call, in the order they must happen."""

    def reply(self, origin: Origin, payload: bytes, note: Note | None = None) -> None:
        self.append(Reply(origin, payload, note))

    def publish(self, channel: Channel, topic: bytes, body: msgspec.Struct | bytes) -> None:
        self.append(Publish(channel, topic, body))

    def exit(self, code: int, reason: str) -> None:
        self.append(Exit(code, reason))
