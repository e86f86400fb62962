"""What an actor's logic asks of the world: the effects its handlers give back.

A handler never touches a socket: it appends effects to the ``Effects`` it is
handed, and the runtime (``engine/actors/base.py`` in a process, the
simulation in ``engine/simulation``) carries them out, in order, once the
handler returns. Slots of the shared offsets and the clock are read (and
slots written) through the ``Env`` the actor was built with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class Send(NamedTuple):
    """Send ``frames`` on the port ``port`` (a reply on a ROUTER, a publication on a PUB)."""

    port: str
    frames: list[bytes]


class Forward(NamedTuple):
    """Pass ``frames`` on to the actor behind ``port`` without waiting; when its queue is full
    or it is not connected, carry out what ``refused()`` gives instead (the client's error reply,
    built only then; None: nothing)."""

    port: str
    frames: list[bytes]
    refused: Callable[[], Send | None]


class Exit(NamedTuple):
    """End the process now with ``code``, without a clean shutdown (fail-stop): the effects
    before it are carried out first, and their sends get a moment to leave."""

    code: int
    reason: str


Effect = Send | Forward | Exit


class Effects(list[Effect]):
    """The effects of one handler call, in the order they must happen."""

    def send(self, port: str, frames: list[bytes]) -> None:
        self.append(Send(port, frames))

    def exit(self, code: int, reason: str) -> None:
        self.append(Exit(code, reason))
