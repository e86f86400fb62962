"""``GroupMember``: a consumer's place in a group that shares a topic's queues.

The engine keeps who is in the group and who holds each queue, by heartbeat
(``engine/services/group_members.py``); the member works out which queues should be its
own, by the allocation every member computes alike (``rmqpy/_allocation.py``), and asks
for them in its heartbeats. A thread of the member's own sends a ``heartbeat`` every third
of the engine's ``consumer_session_timeout_ms`` on a socket of its own, so a consumer whose
application takes its time over a message stays in the group.

The consumer, between polls (``PullConsumer._rebalance``):

1. asks ``share(held)``: its target by the last reply's members; while that list is not
   ``settled`` (the engine has not seen a whole session of heartbeats since it started, or
   became master), the queues it holds, if any; no queue at all once no heartbeat got a
   reply for a whole session (the engine has taken it for dead and the others read its
   queues);
2. reads the queues of that target the engine ``granted`` it, lets the others go and
   commits their positions;
3. then ``want(target)``: the next heartbeat, sent at once, names the target, which lets the
   queues go at the engine and asks for the new ones. Until the engine grants them all
   (their old holders let them go at their own next heartbeat), the member beats every
   ``_PENDING_BEAT_S``.

So a queue has one reader at a time: the next starts at the offset the last committed.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from engine.client import ClientError, StoreClient
from engine.ipc.curve import CurveKeys
from rmqpy._allocation import allocate_averagely

log = logging.getLogger(__name__)

_PENDING_BEAT_S = 0.2  # how often a member beats while a queue of its share is not granted yet


@dataclass
class _View:
    members: tuple[str, ...]
    granted: tuple[int, ...]
    queue_count: int
    settled: bool
    session_ms: int
    at: float  # monotonic seconds of the reply

    def same(self, other: _View) -> bool:
        return (self.members, self.granted, self.queue_count, self.settled) == (
            other.members, other.granted, other.queue_count, other.settled)


def new_client_id() -> str:
    """RocketMQ's ``ip@pid`` in spirit: this host, this process, and a tag for this consumer."""
    return f"{socket.gethostname()}@{os.getpid()}@{secrets.token_hex(4)}"


class GroupMember:
    def __init__(self, group: str, topic: str, *, endpoint: str, timeout_ms: int,
                 context: zmq.Context | None = None, curve: CurveKeys | None = None) -> None:
        """Joins at once and asks for its share (raises ``EngineError`` if the engine refuses: no such
        topic, a pop group)."""
        self.group = group
        self.topic = topic
        self.client_id = new_client_id()
        self._client = StoreClient(endpoint, timeout_ms=timeout_ms, context=context, curve=curve)
        self._wanted: tuple[int, ...] = ()  # the queues the next heartbeat asks for
        self._wake = threading.Event()  # set: beat now (the wanted queues changed, or close)
        self._stop = False
        self._asked: tuple[_View, bool] | None = None  # the view ``share`` last answered from, and if stale
        try:
            self._view = self._beat()
            self._wanted = tuple(self.target(self._view, False, []))
            self._view = self._beat()
        except BaseException:
            self._client.close()
            raise
        self._thread = threading.Thread(target=self._run, name=f"rmqpy-heartbeat-{group}", daemon=True)
        self._thread.start()

    def _beat(self, *, leaving: bool = False) -> _View:
        reply: dict[str, Any] = self._client.request("heartbeat", group=self.group, topic=self.topic,
                                                     client_id=self.client_id, queues=list(self._wanted),
                                                     leaving=leaving)
        return _View(tuple(reply["members"]), tuple(reply["granted"]), reply["queue_count"], reply["settled"],
                     reply["session_timeout_ms"], time.monotonic())

    def _run(self) -> None:
        while True:
            pending = not set(self._wanted) <= set(self._view.granted)
            self._wake.wait(_PENDING_BEAT_S if pending else self._view.session_ms / 3000)
            self._wake.clear()
            if self._stop:
                return
            try:
                view = self._beat()
            except ClientError as exc:  # an engine down, restarting or not master: the next beat tries again
                log.info("heartbeat of %s in group %r not answered: %s", self.client_id, self.group, exc)
                continue
            if view.same(self._view):
                self._view.at = view.at  # the same view, fresh
            else:
                self._view = view  # a new object: the consumer's next look rebalances

    def share(self, held: Sequence[int]) -> tuple[list[int], list[int]] | None:
        """None if nothing changed since the last call; else (the queues to read now, the target).
        The queues to read are the target's that the engine granted; the target is to be asked for
        (``want``) once the queues left out are let go."""
        view = self._view
        stale = time.monotonic() - view.at > view.session_ms / 1000
        if self._asked is not None and self._asked[0] is view and self._asked[1] == stale:
            return None
        self._asked = (view, stale)
        target = self.target(view, stale, held)
        return [q for q in target if q in view.granted], target

    def target(self, view: _View, stale: bool, held: Sequence[int]) -> list[int]:
        """The queues this member should hold by ``view``, given those it ``held`` (sorted)."""
        if stale:
            return []  # the engine has taken this member for dead: others read its queues
        if not view.settled and held:
            return list(held)
        return allocate_averagely(range(view.queue_count), view.members, self.client_id)

    def want(self, queues: Sequence[int]) -> None:
        """Ask for exactly ``queues`` from now on (the others are let go): a heartbeat goes at once."""
        wanted = tuple(queues)
        if wanted != self._wanted:
            self._wanted = wanted
            self._wake.set()

    def close(self) -> None:
        """Leave the group at once (its queues are free for the others at their next heartbeat)."""
        self._stop = True
        self._wake.set()
        self._thread.join()
        try:
            self._beat(leaving=True)
        except ClientError as exc:
            log.info("%s could not say it leaves group %r (%s): its session ends by itself", self.client_id,
                     self.group, exc)
        finally:
            self._client.close()
