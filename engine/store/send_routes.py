"""The topics a client may send to, as the front last saved them: what the writer checks a send
made straight to it against (``engine/services/writer/direct_sends.py``).

The front owns the topic table (``config/topics.json``, ``engine/store/topics.py``) and makes
every change to it. After each save it writes this file in the run directory, whole (written
aside and renamed over it), and only then stores the file's version in the shared offsets
(``SEND_ROUTES``). The writer reads the file again whenever the slot holds a version past its
own, so a send made after the front answered a change is checked under that change::

    <run dir>/send-routes, msgpack
    {"version":   int,               the slot's value once this file is in place (counts up)
     "topics":    {name: [write_queues, read_queues, published]}}

``published`` is the version at which the name entered the table (again, after a deletion):
a topic the writer recorded deleted while the slot was at version V takes sends straight to the
writer again only in an entry published after V (a re-creation), never in the entry that was
there before the deletion. The system topics are left out: only the engine's actors send to
them, through the front's internal port.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from engine.store.shared_offsets import SEND_ROUTES, SharedOffsets
from engine.store.system_topics import SYSTEM_TOPICS
from engine.store.topics import TopicConfig

SEND_ROUTES_FILE = "send-routes"


class SendRoute(msgspec.Struct, array_like=True, frozen=True):
    write_queues: int
    read_queues: int
    published: int  # the version at which this entry entered the table


class SendRoutes(msgspec.Struct, frozen=True):
    version: int
    topics: dict[str, SendRoute]


NO_ROUTES = SendRoutes(0, {})
_decoder = msgspec.msgpack.Decoder(SendRoutes)
_encoder = msgspec.msgpack.Encoder()


class RoutesPublisher:
    """The front's side: ``publish`` after each save of the topic table."""

    def __init__(self, run_dir: Path, slots: SharedOffsets) -> None:
        self.path = run_dir / SEND_ROUTES_FILE
        self.slots = slots
        self.published: dict[str, int] = {}  # each topic's ``published``, while it stays in the table

    def forget(self, topic: str) -> None:
        """The topic left the table (its deletion was recorded): an entry of that name published
        later is a new topic."""
        self.published.pop(topic, None)

    def publish(self, topics: dict[str, TopicConfig]) -> int:
        """Write the file for ``topics``, then store its version in the slot; returns the version.
        The file goes first: a writer that sees the version finds a file at least that new."""
        version = self.slots.get(SEND_ROUTES) + 1
        routes = {}
        for name, config in topics.items():
            if name in SYSTEM_TOPICS:
                continue
            published = self.published.setdefault(name, version)
            routes[name] = SendRoute(config.write_queue_nums, config.read_queue_nums, published)
        for name in self.published.keys() - routes.keys():
            del self.published[name]
        temporary = self.path.with_name(SEND_ROUTES_FILE + ".tmp")
        temporary.write_bytes(_encoder.encode(SendRoutes(version, routes)))
        os.replace(temporary, self.path)  # the run directory's files need no sync: they die with the run
        self.slots.set(SEND_ROUTES, version)
        return version


def read_routes(run_dir: Path) -> SendRoutes:
    """The file as the front last wrote it; ``NO_ROUTES`` when there is none yet (or, a bug, one
    that does not decode: every send then goes through the front)."""
    try:
        return _decoder.decode((run_dir / SEND_ROUTES_FILE).read_bytes())
    except FileNotFoundError:
        return NO_ROUTES
    except (msgspec.DecodeError, msgspec.ValidationError):
        return NO_ROUTES
