"""``GroupMember``: a consumer's place in a group that shares a topic's queues.

The engine keeps who is in the group and who holds each queue, by heartbeat
(``engine/services/front/group_members.py``); the member works out which queues should be its
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
   queues go at the engine and asks for the new ones (and ``reading``: the queues it reads,
   which a front that just started grants back first). Until the engine grants them all
   (their old holders let them go at their own next heartbeat), the member beats every
   ``_PENDING_BEAT_S``.

So a queue has one reader at a time: the next starts at the offset the last committed. The
decisions are ``MemberState``'s (``rmqpy/_member_state.py``), which the seeded simulation drives
too; this class gives it a socket, a thread and the clock.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Sequence

import zmq

from engine.client import ClientError, StoreClient
from engine.ipc.curve import CurveKeys
from rmqpy._member_state import MemberState

log = logging.getLogger(__name__)


def new_client_id() -> str:
    """RocketMQ's ``ip@pid`` in spirit: this host, this process, and a tag for this consumer."""
    return f"{socket.gethostname()}@{os.getpid()}@{secrets.token_hex(4)}"


class GroupMember:
    def __init__(self, group: str, topic: str, *, endpoint: str, timeout_ms: int,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None, curve: CurveKeys | None = None) -> None:
        """Joins at once and asks for its share (raises ``EngineError`` if the engine refuses: no such
        topic, a pop group)."""
        self.group = group
        self.topic = topic
        self.state = MemberState(new_client_id())
        self.client_id = self.state.client_id
        self._client = StoreClient(endpoint, timeout_ms=timeout_ms, context=context, curve=curve)
        self._wake = threading.Event()  # set: beat now (the wanted queues changed, or close)
        self._stop = False
        try:
            self._beat()
            view = self.state.view
            assert view is not None
            self.state.want(self.state.target(view, False, []))
            self._beat()
        except BaseException:
            self._client.close()
            raise
        self._thread = threading.Thread(target=self._run, name=f"rmqpy-heartbeat-{group}", daemon=True)
        self._thread.start()

    def _beat(self, *, leaving: bool = False) -> None:
        sent_at = time.monotonic()
        fields = self.state.request(sent_at, leaving=leaving)
        number = self.state.sent
        reply = self._client.request("heartbeat", group=self.group, topic=self.topic, **fields)
        self.state.on_reply(reply, sent_at, time.monotonic(), number)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.state.interval_s())
            self._wake.clear()
            if self._stop:
                return
            try:
                self._beat()
            except ClientError as exc:  # an engine down, restarting or not master: the next beat tries again
                log.info("heartbeat of %s in group %r not answered: %s", self.client_id, self.group, exc)

    def changed(self, now: float) -> bool:
        """``MemberState.changed``: whether the consumer should look at its share (``now``: monotonic)."""
        return self.state.changed(now)

    def share(self, held: Sequence[int]) -> tuple[list[int], list[int]] | None:
        """``MemberState.share`` now."""
        return self.state.share(held, time.monotonic())

    def reading(self, queues: Sequence[int]) -> None:
        """The consumer reads ``queues`` now: the next heartbeat says so (a front that just started
        grants a member only what it reads until the others have beaten)."""
        self.state.reading(queues)

    def want(self, queues: Sequence[int]) -> None:
        """Ask for exactly ``queues`` from now on (the others are let go): a heartbeat goes at once."""
        if self.state.want(queues):
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
