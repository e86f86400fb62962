"""Sends made straight to the writer: the checks the front would make, over the routes it saved.

A client that knows the route (``StoreClient``, told by the ``route`` answer's ``send_endpoint``)
sends to the writer's own port (``channels.replies("writer")``): client -> writer -> client,
one process crossed instead of two. The writer checks such a send as the front checks one it
routes (``engine/services/front/topic_rules.py``: the topic exists, the queue is one of its
queues) against the topics the front last saved (``engine/store/send_routes.py``), chooses the
queue the same way (given, by sharding key, or round robin), and appends it as any other.

Whatever only the front can decide is passed back to the client, nothing stored, with
``ROUTE_VIA_FRONT``, and the client sends the same request to the front: a topic the routes do
not hold (maybe auto-created, maybe another broker set's, maybe a name to refuse), a queue out of
range (the front's refusal names the queues), a replica or a master whose lease lapsed (the
front names the master), an engine that checks users (``acl_enabled``: the front's guard checks
and audits each request), a routes file older than the version in the shared offsets.

The routes are read again whenever the shared offsets hold a newer version than the one read
(a check per send), so a change the front answered before a send is the rule of that send. A
topic deletion is decided here, in the log's order (``engine/services/writer/deletion_records.py``):
from the moment the writer records one, it takes the topic's sends again only under an entry
the front published after that moment (a re-creation), never under the one it had before; the
sends it took earlier lie below the deletion offset, hidden with the rest of the topic.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from engine.config import StoreConfig
from engine.errors import ErrorCode, RequestError
from engine.ipc.protocol import Envelope
from engine.layout import java_string_hash
from engine.store.send_routes import NO_ROUTES, SendRoutes, read_routes
from engine.store.shared_offsets import LEASE_DEADLINE, SEND_ROUTES, SharedOffsets


def via_front(why: str) -> RequestError:
    return RequestError(ErrorCode.ROUTE_VIA_FRONT, f"nothing was stored: {why}; send it to the front")


class DirectSends:
    """The writer's routes and its decisions on the sends made straight to it."""

    def __init__(self, run_dir: Path, slots: SharedOffsets, config: StoreConfig) -> None:
        self.run_dir = run_dir
        self.slots = slots
        self.config = config
        self.routes: SendRoutes = NO_ROUTES
        self.deleted_at: dict[str, int] = {}  # topic -> the routes' version when its deletion was recorded
        self.round_robin: dict[str, itertools.count[int]] = {}
        self.taken = 0  # sends checked here and appended
        self.passed_on = 0  # sends passed back to go through the front

    def deleted(self, topic: str) -> None:
        """The writer recorded the topic's deletion: its entry published before now takes no more sends here."""
        self.deleted_at[topic] = self.slots.get(SEND_ROUTES)
        self.round_robin.pop(topic, None)

    def current(self) -> SendRoutes:
        """The routes, read again if the front published a newer version since."""
        version = self.slots.get(SEND_ROUTES)
        if version != self.routes.version:
            self.routes = read_routes(self.run_dir)
        if self.routes.version < version:
            raise via_front(f"the writer's send routes (version {self.routes.version}) are older than the "
                            f"topic table's (version {version})")
        return self.routes

    def queue_of(self, envelope: Envelope, now_ms: int) -> int:
        """The queue a send straight to the writer goes to; ``RequestError`` ROUTE_VIA_FRONT when
        the front must decide (see the module's text), nothing done."""
        try:
            queue_id = self._queue_of(envelope, now_ms)
        except RequestError:
            self.passed_on += 1
            raise
        self.taken += 1
        return queue_id

    def _queue_of(self, envelope: Envelope, now_ms: int) -> int:
        cfg = self.config
        if envelope.op != "send":
            raise via_front(f"the writer's port takes only sends, not {envelope.op!r}")
        if cfg.acl_enabled:
            raise via_front("this engine checks users (acl_enabled): the front checks each request")
        if cfg.is_replica or (cfg.elected and now_ms > self.slots.get(LEASE_DEADLINE)):
            raise via_front("this engine does not take sends now")
        topic = envelope.topic
        route = self.current().topics.get(topic) if isinstance(topic, str) else None
        if route is None:
            raise via_front(f"the writer does not know topic {topic!r}")
        assert isinstance(topic, str)
        if route.published <= self.deleted_at.get(topic, -1):
            raise via_front(f"topic {topic!r} was deleted after its entry was published")
        queue_id = envelope.queue_id
        if queue_id is not None:
            if not 0 <= queue_id < route.read_queues:
                raise via_front(f"queue {queue_id!r} is not one of topic {topic!r}'s queues")
            return queue_id
        if isinstance(envelope.sharding_key, str):
            return abs(java_string_hash(envelope.sharding_key)) % route.write_queues
        return next(self.round_robin.setdefault(topic, itertools.count())) % route.write_queues
