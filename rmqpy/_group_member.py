"""``GroupMember``: a consumer's place in a group that shares a topic's queues.

The engine keeps who is in the group, by heartbeat (``engine/services/group_members.py``);
the member keeps which queues are its own, by the allocation every member computes alike
(``rmqpy/_allocation.py``). A thread of the member's own sends a ``heartbeat`` every third
of the engine's ``consumer_session_timeout_ms`` on a socket of its own, so a consumer
whose application takes its time over a message stays in the group; the consumer asks
``queues`` between polls and moves to the answer.

What ``queues`` answers, from the last heartbeat's reply:

* the member's share of the queues by the live members it names;
* while that list is not ``settled`` (the engine has not seen a whole session of
  heartbeats since it started, or became master), the queues held already, if any;
* no queue at all once no heartbeat got a reply for a whole session: the engine has
  taken the member for dead and the others read its queues (the member takes its share
  again at the next reply).

A queue changes hands without a handshake: its old member commits its position and lets
go at its next heartbeat while the new one starts at the committed offset at its own, so
across a rebalance a message may be read by both (at least once), never by neither.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq

from engine.client import ClientError, StoreClient
from engine.ipc.curve import CurveKeys
from rmqpy._allocation import allocate_averagely

log = logging.getLogger(__name__)


@dataclass
class _View:
    members: tuple[str, ...]
    queue_count: int
    settled: bool
    session_ms: int
    at: float  # monotonic seconds of the reply


def new_client_id() -> str:
    """RocketMQ's ``ip@pid`` in spirit: this host, this process, and a tag for this consumer."""
    return f"{socket.gethostname()}@{os.getpid()}@{secrets.token_hex(4)}"


class GroupMember:
    def __init__(self, group: str, topic: str, *, endpoint: str, timeout_ms: int,
                 context: zmq.Context | None = None, curve: CurveKeys | None = None) -> None:
        """Joins at once (raises ``EngineError`` if the engine refuses: no such topic, a pop group)."""
        self.group = group
        self.topic = topic
        self.client_id = new_client_id()
        self._client = StoreClient(endpoint, timeout_ms=timeout_ms, context=context, curve=curve)
        self._stop = threading.Event()
        try:
            self._view = self._beat()
        except BaseException:
            self._client.close()
            raise
        self._asked: tuple[_View, bool] | None = None  # the view ``queues`` last answered from, and if stale
        self._thread = threading.Thread(target=self._run, name=f"rmqpy-heartbeat-{group}", daemon=True)
        self._thread.start()

    @property
    def interval_s(self) -> float:
        return self._view.session_ms / 3000

    def _beat(self, *, leaving: bool = False) -> _View:
        reply: dict[str, Any] = self._client.request("heartbeat", group=self.group, topic=self.topic,
                                                     client_id=self.client_id, leaving=leaving)
        return _View(tuple(reply["members"]), reply["queue_count"], reply["settled"], reply["session_timeout_ms"],
                     time.monotonic())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                view = self._beat()
            except ClientError as exc:  # an engine down, restarting or not master: the next beat tries again
                log.info("heartbeat of %s in group %r not answered: %s", self.client_id, self.group, exc)
                continue
            old = self._view
            if (view.members, view.queue_count, view.settled) != (old.members, old.queue_count, old.settled):
                self._view = view  # a new object: the consumer's next look rebalances
            else:
                self._view.at = view.at  # the same view, fresh

    def queues(self, held: list[int]) -> list[int]:
        """The queues this member should consume now, given those it ``held`` (sorted). Cheap when
        nothing changed since the last call (it is asked between polls)."""
        view = self._view
        stale = time.monotonic() - view.at > view.session_ms / 1000
        if self._asked is not None and self._asked[0] is view and self._asked[1] == stale:
            return held
        self._asked = (view, stale)
        if stale:
            return []  # the engine has taken this member for dead: others read its queues
        if not view.settled and held:
            return held
        return allocate_averagely(range(view.queue_count), view.members, self.client_id)

    def close(self) -> None:
        """Leave the group at once (the others take its queues at their next heartbeat)."""
        self._stop.set()
        self._thread.join()
        try:
            self._beat(leaving=True)
        except ClientError as exc:
            log.info("%s could not say it leaves group %r (%s): its session ends by itself", self.client_id,
                     self.group, exc)
        finally:
            self._client.close()
