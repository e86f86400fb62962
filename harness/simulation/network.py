"""The simulated network: the engine's socket topology as queues, delivered in a seeded order.

Ports are matched by endpoint as ZeroMQ matches them: a DEALER that connects to a
ROUTER's endpoint reaches it with its name as identity and gets the ROUTER's
replies to that identity; a PUB reaches every SUB connected to its endpoint whose
subscription prefixes the topic frame. Each (receiver, port, sender) pair is one
FIFO queue, as one ZeroMQ connection is; the world picks which queue delivers
next, so deliveries from different senders interleave in every order. Publications
may be dropped (a full high-water mark), and whatever was queued for an actor that
crashes is lost with it.

Two engines (a master and its replica) share one network: the replica's actors go by
``replica/<name>``, and an internal endpoint (a file of an engine's run directory) joins only
the actors of one engine; a ``tcp://`` endpoint (replication's) joins them across engines.
A partition between two parties (engines by their prefix, and ``CLIENT``) drops what one sends
the other until it heals, as a connection that breaks and comes back loses what was in flight.

A client may also connect to the actors that answer it past the front (their ``replies-<actor>``
ROUTERs, ``engine/ipc/direct_replies.py``): ``connect`` names the endpoints, ``rejoin`` is
ZeroMQ's reconnection (each one whose actor is up again joins), and an actor's death breaks its
joins. An answer ``wire.direct_frames`` lets go past the front reaches a client joined at the
actor's endpoint straight; any other goes through the front, as ROUTER_MANDATORY makes it. A
client joined at the writer's endpoint may send there too (``to_actor``: a send straight to the
writer, ``engine/services/writer/direct_sends.py``), and the writer answers on that ROUTER.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.actors.base import DEALER, PUB, ROUTER, SUB, Port
from engine.actors.effects import Publish, Reply, Tell
from engine.ipc import channels, wire

CLIENT = "client"  # the name the simulated clients go by


@dataclass(frozen=True)
class Address:
    actor: str
    port: str


QueueKey = tuple[str, str, str]  # receiver, port, sender


def party(actor: str) -> str:
    """The engine an actor belongs to (its prefix, "" for an engine without one), or the client."""
    return CLIENT if actor == CLIENT else actor.rpartition("/")[0]


def same_engine(actor: str, other: str, endpoint: str) -> bool:
    """May ``actor`` and ``other`` meet at ``endpoint``: one engine's, or a tcp one between engines."""
    return "://" in endpoint or actor.rpartition("/")[0] == other.rpartition("/")[0]


class Network:
    def __init__(self, rng: random.Random, *, publication_loss_ratio: float) -> None:
        self.rng = rng
        self.publication_loss_ratio = publication_loss_ratio
        self.ports: dict[str, dict[str, Port]] = {}  # actor -> port name -> port
        self.up: set[str] = set()
        self.queues: dict[QueueKey, deque[list[bytes]]] = {}
        self.to_client: Callable[[list[bytes], str], None] = lambda frames, sender: None
        self.publications_lost = 0
        self.partitions: set[frozenset[str]] = set()  # pairs of parties that cannot reach each other
        self.partitioned_drops = 0
        self.connects: dict[bytes, list[str]] = {}  # a client's routing id -> the direct endpoints it connects to
        self.joined: dict[bytes, set[str]] = {}  # ... -> those of them it is connected to now
        self.tcp_ports = itertools.count(40_000)  # the ports "the system gives" (``direct_endpoint``)

    def partitioned(self, one: str, other: str) -> bool:
        return frozenset((party(one), party(other))) in self.partitions

    def attach(self, actor: str, ports: list[Port]) -> None:
        for port in ports:
            assert port.channel.opened_by(actor.rpartition("/")[2], bind=port.bind), \
                f"{actor} may not open {port.channel.name}"
        self.ports[actor] = {port.name: port for port in ports}
        self.up.add(actor)

    def detach(self, actor: str) -> None:
        """The actor's process is gone: what was queued for it is lost, and so are the clients' joins to it."""
        self.up.discard(actor)
        for key in [key for key in self.queues if key[0] == actor]:
            del self.queues[key]
        bound = {port.endpoint for port in self.ports.get(actor, {}).values() if port.bind}
        for joined in self.joined.values():
            joined.difference_update(bound)

    def connect(self, client: bytes, endpoints: list[str]) -> None:
        """``client``'s socket connects to ``endpoints`` too (its direct answers); they join at ``rejoin``."""
        known = self.connects.setdefault(client, [])
        known += [endpoint for endpoint in endpoints if endpoint not in known]

    def rejoin(self, client: bytes) -> None:
        """ZeroMQ's reconnection: each endpoint ``client`` connects to whose actor is up is joined."""
        self.joined[client] = {endpoint for endpoint in self.connects.get(client, ())
                               if self.bound(endpoint, CLIENT) is not None}

    def bound(self, endpoint: str, near: str = "") -> Address | None:
        """Who binds ``endpoint`` where ``near`` (an actor) connects: in its engine, unless over tcp."""
        for actor, ports in self.ports.items():
            for port in ports.values():
                if port.bind and port.endpoint == endpoint and actor in self.up and same_engine(actor, near,
                                                                                                 endpoint):
                    return Address(actor, port.name)
        return None

    def push(self, receiver: str, port: str, sender: str, frames: list[bytes]) -> None:
        if self.partitioned(receiver, sender):
            self.partitioned_drops += 1
        elif receiver in self.up:
            self.queues.setdefault((receiver, port, sender), deque()).append(frames)

    def carry(self, sender: str, effect: Reply | Tell | Publish) -> bool:
        """Deliver one effect of ``sender``, its frames laid out as the runtime lays them
        (``engine/ipc/wire.py``); False if a Tell's peer is down."""
        if isinstance(effect, Reply):
            direct = wire.direct_frames(*effect)
            if direct is not None and self.answered_directly(sender, *direct):
                return True
            channel, frames = effect.origin.channel, wire.reply_frames(*effect)
        elif isinstance(effect, Tell):
            channel, frames = effect.channel, wire.request_frames(*effect[:3])
        else:
            channel, frames = effect.channel, wire.publication_frames(*effect)
        port = self.ports[sender][channel.name]
        assert port.channel is channel, (sender, channel.name)
        if port.kind == DEALER:
            peer = self.bound(port.endpoint, sender)
            if peer is None:
                return False  # IMMEDIATE: nothing is queued for an actor that is not there
            self.push(peer.actor, peer.port, sender, [sender.encode(), *frames])
        elif port.kind == ROUTER:
            identity, rest = frames[0].decode(), frames[1:]
            if channel is channels.CLIENTS:
                if self.partitioned(sender, CLIENT):
                    self.partitioned_drops += 1
                else:
                    self.to_client(rest if rest[0] != b"" else rest[1:], sender)
            elif channel is channels.replies(sender.rpartition("/")[2]):  # to a client that sent on it
                if port.endpoint not in self.joined.get(frames[0], ()):
                    pass  # the client's connection is gone: ROUTER_MANDATORY refuses, the runtime drops it
                elif self.partitioned(sender, CLIENT):
                    self.partitioned_drops += 1
                else:
                    self.to_client(rest, sender)
            elif identity in self.up:
                dealer = next((p for p in self.ports[identity].values()
                               if p.kind == DEALER and p.endpoint == port.endpoint), None)
                if dealer is not None:  # else it connects elsewhere now (a replica following a new
                    self.push(identity, dealer.name, sender, rest)  # master): a ROUTER drops it
        else:
            assert port.kind == PUB
            for actor, ports in self.ports.items():
                for sub in ports.values():
                    if sub.kind == SUB and sub.endpoint == port.endpoint and same_engine(actor, sender, sub.endpoint) \
                            and any(frames[0].startswith(topic) for topic in sub.subscribe):
                        if self.rng.random() < self.publication_loss_ratio:
                            self.publications_lost += 1
                            continue
                        self.push(actor, sub.name, sender, frames)
        return True

    def answered_directly(self, sender: str, client: bytes, payload: bytes) -> bool:
        """The answer straight to ``client`` if it is joined at ``sender``'s ``replies`` ROUTER (lost
        on a partition, as a send on a broken connection is); False: not joined, the front answers."""
        joined = self.joined.get(client, set())
        port = self.ports[sender].get(channels.replies(sender.rpartition("/")[2]).name)
        if port is None or port.endpoint not in joined:
            return False
        if self.partitioned(sender, CLIENT):
            self.partitioned_drops += 1
        else:
            self.to_client([payload], sender)
        return True

    def to_actor(self, endpoint: str, client_id: bytes, frame: bytes) -> bool:
        """A request straight to the actor bound at ``endpoint`` (the writer's ``replies`` ROUTER);
        False, nothing sent, unless the client is joined there (ROUTER_MANDATORY) and not cut off."""
        if endpoint not in self.joined.get(client_id, ()):
            return False
        peer = self.bound(endpoint, CLIENT)
        if peer is None or self.partitioned(peer.actor, CLIENT):
            return False
        self.push(peer.actor, peer.port, CLIENT, [client_id, frame])
        return True

    def from_client(self, front: str, client_id: bytes, frame: bytes) -> bool:
        if front not in self.up or self.partitioned(front, CLIENT):
            return False
        self.push(front, "clients", CLIENT, [client_id, frame])
        return True

    def busy(self) -> list[QueueKey]:
        return [key for key, queue in self.queues.items() if queue]

    def take(self, key: QueueKey, count: int) -> list[list[bytes]]:
        queue = self.queues[key]
        return [queue.popleft() for _ in range(min(count, len(queue)))]
