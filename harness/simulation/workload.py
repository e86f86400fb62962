"""The simulated client: sends and pulls through the front, and remembers what the store promised.

What must survive depends on the flush mode, as the README promises: a send answered
``PUT_OK`` under SYNC_FLUSH is on disk; under ASYNC_FLUSH (or after a FLUSH_DISK_TIMEOUT)
only what lay below the flushed offset when the power went is. A process kill loses
nothing that was answered. Under SYNC_FLUSH a pulled message was flushed, so it too
survives every power cut.

Two pop groups on ``POP_TOPIC``, ``POP_GROUP`` and the FIFO group ``FIFO_GROUP``, pop, ack
some of what they get, nack some and let the rest expire. A message whose ack the engine
confirmed is never delivered to its group again: under SYNC_FLUSH through every fault, under
ASYNC_FLUSH until a power cut (which may take the acks of the last flush interval). The FIFO
group never gets a message of a queue while an earlier one it was given is still open (no ack
sent for it, and not at the attempt limit), unless that one comes first in the same reply.

Delayed sends go to ``TIMER_TOPIC``; each one the flush mode promised must arrive there once
(``checks.py`` also finds any move made twice, or before its deliver time, in the log).
Half messages go to ``TRANSACTION_TOPIC`` and are committed or rolled back at once: each
decision the flush mode promised holds (a commit arrives once, a rollback never).

The client's socket is a ZeroMQ-named one (its routing id begins with a 0 byte: the front
answers it) or, with ``direct``, one that chose its id as ``StoreClient`` does: the front marks
its requests ``DIRECT``, it asks for ``route`` beside its first request and connects to the
``reply_endpoints`` the answer names, and the writer and the owners answer it past the front
whenever it is joined to them (``network.py``). Each answer is checked the same, whichever way
it came; a request in flight when the front dies may still be answered straight. Joined at the
writer's ``send_endpoint``, it sends there (a send straight to the writer), and sends again to the
front what the writer passes back (ROUTE_VIA_FRONT), as ``StoreClient`` does; except for a topic
whose deletion answer was lost: only a send through the front tells that the deletion, if it was
made, lies below it (the front's requests reach the writer in order), so those go to the front.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from engine import codec
from engine.errors import ErrorCode
from engine.ipc.protocol import SendMessage, encode_request
from engine.local_reads import LocalReads
from harness.simulation.network import Network

TOPICS = {"sim-a": 2, "sim-b": 3}
TIMER_TOPIC = "sim-t"  # delayed messages only; never deleted
TRANSACTION_TOPIC = "sim-x"  # transactional messages only; never deleted
PULL_MESSAGES_MAX = 16
ROUTE_REQUEST_ID = 2**53  # the ``route`` asked beside the first request, as ``StoreClient`` asks it
ZEROMQ_NAMED, OWN_ID = b"\0c1", b"c1"  # the client's routing id: not direct, direct (``Workload.direct``)
POP_TOPIC, POP_GROUP, FIFO_GROUP = "sim-b", "sim-pop", "sim-fifo"

Position = tuple[str, int, int]  # topic, queue id, queue offset


@dataclass(frozen=True)
class Stored:
    body: bytes
    key: str
    commit_log_offset: int


@dataclass
class Workload:
    rng: random.Random
    network: Network
    sync_flush: bool
    front: str = "front"
    ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    waiting: dict[int, tuple] = field(default_factory=dict)  # request id -> what it was
    durable: dict[Position, Stored] = field(default_factory=dict)  # must survive everything
    unsettled: dict[Position, Stored] = field(default_factory=dict)  # answered, but a power cut may take it
    seen: dict[Position, bytes] = field(default_factory=dict)  # pulled (SYNC_FLUSH: must survive too)
    next_pull: dict[tuple[str, int], int] = field(default_factory=dict)
    deleted_below: dict[str, int] = field(default_factory=dict)  # topic -> its last deletion offset
    epochs: dict[str, int] = field(default_factory=dict)  # topic -> deletions seen: older pulls are void
    deleting: set[str] = field(default_factory=set)  # deletions asked for and not answered yet
    # topic -> the first request id after its deletion's answer was lost: until a later send is
    # answered, the deletion may still be carried out (the writer takes it from its queue), and what
    # a pull or pop reads of the topic may be what it deletes
    doubtful: dict[str, int] = field(default_factory=dict)
    # topic -> the same first request id, kept once the doubt is settled: a send of the topic asked
    # before it was asked before the deletion too, and is promised nothing (a direct answer may come late)
    asked_before_doubt: dict[str, int] = field(default_factory=dict)
    sent_messages: int = 0
    deletions: int = 0
    acked: int = 0
    pulled: int = 0
    popped: int = 0
    pop_acked: int = 0
    acked_positions: dict[tuple[str, Position], bytes] = field(default_factory=dict)  # (group, position) acked
    fifo_open: dict[Position, int] = field(default_factory=dict)  # the FIFO group's deliveries -> attempt
    attempts_max: int = 16
    pop_topic_ratio: float = 0.0  # of sends: to the pop groups' topic (the rest to any topic)
    violations: list[str] = field(default_factory=list)
    delayed_durable: dict[bytes, int] = field(default_factory=dict)  # body -> its timer record's offset
    delayed_unsettled: dict[bytes, int] = field(default_factory=dict)
    delayed_sent: int = 0
    decided: dict[bytes, str] = field(default_factory=dict)  # body -> the decision the engine confirmed
    decided_unsettled: dict[bytes, str] = field(default_factory=dict)

    # A reader on the engine's host (``LocalReads``, over the store's mapped files): each pull is
    # also read through it, at once, and checked as the engine's answers are. None: no such reader.
    local_reads: Callable[[], LocalReads | None] = lambda: None
    local_pulled: int = 0
    direct: bool = False  # a client answered past the front when it can (see above)
    route_asked: bool = False
    routed: bool = False  # the ``route`` answer came: the client connected to the endpoints it names
    direct_answers: int = 0
    send_endpoint: str = ""  # the writer's port, from the ``route`` answer ("": sends go to the front)
    straight: dict[int, bytes] = field(default_factory=dict)  # sends made straight to the writer: id -> frame
    straight_sends: int = 0
    passed_back: int = 0

    def __post_init__(self) -> None:
        self.network.to_client = self.on_reply

    @property
    def client_id(self) -> bytes:
        return OWN_ID if self.direct else ZEROMQ_NAMED

    def request(self, op: str, what: tuple, **fields: object) -> None:
        if self.direct:
            self.join_direct()
        request_id = next(self.ids)
        frame = encode_request(op, request_id, **fields)
        if op == "send" and self.send_endpoint and fields.get("topic") not in self.doubtful \
                and self.network.to_actor(self.send_endpoint, self.client_id, frame):
            self.waiting[request_id] = what
            self.straight[request_id] = frame
            self.straight_sends += 1
        elif self.network.from_client(self.front, self.client_id, frame):
            self.waiting[request_id] = what

    def join_direct(self) -> None:
        """``route`` beside the first request (again after a front died before answering it), and
        ZeroMQ's reconnection to each actor that answers directly and is up (again)."""
        if not self.route_asked:
            self.route_asked = self.network.from_client(self.front, self.client_id,
                                                        encode_request("route", ROUTE_REQUEST_ID))
        self.network.rejoin(self.client_id)

    def on_route(self, reply: dict) -> None:
        endpoints = reply.get("reply_endpoints", []) if reply.get("ok") else []
        self.network.connect(self.client_id, [e for e in endpoints if isinstance(e, str) and "://" in e])
        self.send_endpoint = reply.get("send_endpoint", "") if reply.get("ok") else ""
        self.routed = True

    def create_topics(self) -> None:
        for topic, count in [*TOPICS.items(), (TIMER_TOPIC, 1), (TRANSACTION_TOPIC, 1)]:
            self.request("create_topic", ("create",), topic=topic, queue_count=count)

    def send_half(self) -> None:
        n = self.delayed_sent = self.delayed_sent + 1
        body = f"x{n}:".encode() + self.rng.randbytes(self.rng.randrange(8, 200))
        self.request("send", ("half", body), topic=TRANSACTION_TOPIC, messages=[{"body": body}], transaction=True,
                     producer_group="sim-producers")

    def send_delayed(self) -> None:
        n = self.delayed_sent = self.delayed_sent + 1
        body = f"d{n}:".encode() + self.rng.randbytes(self.rng.randrange(8, 200))
        self.request("send", ("delayed", body), topic=TIMER_TOPIC, messages=[{"body": body}],
                     delay_ms=self.rng.randrange(1, 400))

    def send(self) -> None:
        if self.pop_topic_ratio and self.rng.random() < self.pop_topic_ratio:
            topic = POP_TOPIC
        else:
            topic = self.rng.choice(sorted(TOPICS))
        if topic in self.deleting:
            return
        batch = []
        for _ in range(self.rng.randint(1, 4)):
            n = self.sent_messages = self.sent_messages + 1
            body = f"m{n}:".encode() + self.rng.randbytes(self.rng.randrange(8, 700))
            batch.append(SendMessage(body=body, keys=[f"k{n}"], tags=self.rng.choice("AB")))
        sent = ("send", topic, [(m.body, m.keys[0]) for m in batch])
        if n % 2:  # every other batch as records the client encoded (drawing nothing more from the rng)
            records, _ = codec.batch_records(batch, "51A1", n)
            self.request("send", sent, topic=topic, records=records, queue_id=self.rng.randrange(TOPICS[topic]))
        else:
            maps = [{"body": m.body, "keys": m.keys, "tags": m.tags} for m in batch]
            self.request("send", sent, topic=topic, messages=maps, queue_id=self.rng.randrange(TOPICS[topic]))

    def delete_topic(self) -> None:
        """Delete a topic, then create it again (its queues start again at offset 0)."""
        topic = self.rng.choice(sorted(TOPICS))
        self.deleting.add(topic)  # no sends to it until the answer: every message it has is older
        self.request("delete_topic", ("delete", topic), topic=topic)

    def pull(self) -> None:
        topic = self.rng.choice(sorted(TOPICS))
        queue_id = self.rng.randrange(TOPICS[topic])
        offset = self.next_pull.get((topic, queue_id), 0)
        self.request("pull", ("pull", topic, queue_id, self.epochs.get(topic, 0)), topic=topic, queue_id=queue_id,
                     offset=offset, max_messages=PULL_MESSAGES_MAX)
        local = self.local_reads()
        if local is not None and topic not in self.doubtful:
            reply = local.pull(topic, queue_id, offset, max_messages=PULL_MESSAGES_MAX)
            self.check_pulled(topic, queue_id, [(m.queue_offset, bytes(m.body)) for m in reply.messages], "local pull")

    def pop(self) -> None:
        if POP_TOPIC in self.deleting:
            return
        group = self.rng.choice((POP_GROUP, FIFO_GROUP))
        self.request("pop", ("pop", self.epochs.get(POP_TOPIC, 0), group), group=group, topic=POP_TOPIC,
                     max_messages=self.rng.randint(1, 8), invisible_ms=self.rng.choice([50, 200, 1_000]))

    def check_fifo(self, reply: dict) -> None:
        """No delivery of a queue's message while an earlier one is open, unless it comes first here."""
        here = {(POP_TOPIC, m["queue_id"], m["queue_offset"]) for m in reply["messages"]}
        for message, attempt in zip(reply["messages"], reply["attempts"], strict=True):
            position = (POP_TOPIC, message["queue_id"], message["queue_offset"])
            earlier = [p for p in self.fifo_open if p[:2] == position[:2] and p[2] < position[2] and p not in here]
            if earlier:
                self.violations.append(f"fifo pop {position}: delivered while {earlier[0]} is open")
            self.fifo_open[position] = attempt
            if attempt >= self.attempts_max:
                del self.fifo_open[position]  # the engine dead-letters it when this delivery expires

    def on_popped(self, reply: dict, epoch: int, group: str) -> None:
        """Check each delivery; then ack about half, nack a few, and let the rest expire."""
        if epoch != self.epochs.get(POP_TOPIC, 0) or POP_TOPIC in self.doubtful:
            return
        if group == FIFO_GROUP:
            self.check_fifo(reply)
        by_queue: dict[int, list[tuple[str, Position, bytes]]] = {}
        for message, handle in zip(reply["messages"], reply["receipt_handles"], strict=True):
            position = (POP_TOPIC, message["queue_id"], message["queue_offset"])
            body = bytes(message["body"])
            self.popped += 1
            if (group, position) in self.acked_positions:
                self.violations.append(f"pop {group} {position}: delivered again after its ack was confirmed")
            expected = self.durable.get(position) or self.unsettled.get(position)
            if expected is not None and expected.body != body:
                self.violations.append(f"pop {position}: a different message than the one stored there")
            fate = self.rng.random()
            if fate < 0.5:
                by_queue.setdefault(message["queue_id"], []).append((handle, position, body))
            elif fate < 0.6:
                self.request("change_invisible", ("nack",), group=group, topic=POP_TOPIC,
                             queue_id=message["queue_id"], receipt_handle=handle, invisible_ms=0)
        for queue_id, acks in by_queue.items():
            if group == FIFO_GROUP:
                for _handle, position, _body in acks:
                    self.fifo_open.pop(position, None)  # maybe done from now on
            self.request("ack", ("ack", epoch, group, {h: (p, b) for h, p, b in acks}), group=group,
                         topic=POP_TOPIC, queue_id=queue_id, receipt_handles=[h for h, _p, _b in acks])

    def on_acked(self, reply: dict, epoch: int, group: str, acks: dict[str, tuple[Position, bytes]]) -> None:
        if epoch != self.epochs.get(POP_TOPIC, 0):
            return
        refused = {failure["receipt_handle"] for failure in reply["failed"]}
        for handle, (position, body) in acks.items():
            if handle not in refused:
                self.acked_positions[(group, position)] = body
                self.pop_acked += 1

    def on_reply(self, frames: list[bytes], sender: str = "") -> None:
        reply = msgspec.msgpack.decode(frames[-1])
        if reply.get("id") == ROUTE_REQUEST_ID:
            self.on_route(reply)
            return
        self.direct_answers += sender not in ("", self.front)
        straight = self.straight.pop(reply.get("id"), None)
        if straight is not None and not reply.get("ok") and reply["error"]["code"] == ErrorCode.ROUTE_VIA_FRONT:
            self.passed_back += 1  # nothing was stored: the same request to the front
            if not self.network.from_client(self.front, self.client_id, straight):
                self.waiting.pop(reply["id"], None)
            return
        what = self.waiting.pop(reply.get("id"), None)
        if what is not None and what[0] == "delete" and not reply.get("ok"):
            if ("delete", what[1]) not in self.waiting.values():  # refused, and no other deletion of it asked
                self.deleting.discard(what[1])  # the topic stays
            return
        if what is None or not reply.get("ok"):
            return  # refused (BUSY, not available, ...): nothing was promised
        if what[0] == "delete":
            self.deleting.discard(what[1])
            self.doubtful.pop(what[1], None)  # the writer took this deletion after any earlier one
            self.forget_topic(what[1], reply["deletion_offset"])
            self.request("create_topic", ("create",), topic=what[1], queue_count=TOPICS[what[1]])
        elif what[0] == "send":
            _, topic, messages = what
            if straight is None:  # only the front's order tells that a lost deletion lies below this send
                self.settle_doubts(reply["id"])
            if reply["id"] < self.asked_before_doubt.get(topic, 0):
                return  # stored before a deletion whose answer was lost, and maybe deleted with the topic
            for (body, key), result in zip(messages, reply["results"], strict=True):
                if result["commit_log_offset"] < self.deleted_below.get(topic, 0):
                    continue  # answered after the deletion, but stored before it: deleted with the topic
                position = (topic, result["queue_id"], result["queue_offset"])
                stored = Stored(body, key, result["commit_log_offset"])
                self.acked += 1
                if self.sync_flush and result["status"] == "PUT_OK":
                    self.durable[position] = stored
                else:
                    self.unsettled[position] = stored
        elif what[0] == "half":
            decision = self.rng.choice(("commit", "rollback"))
            self.request("end_transaction", ("decided", what[1], decision), msg_id=reply["results"][0]["msg_id"],
                         decision=decision)
        elif what[0] == "decided":
            (self.decided if self.sync_flush else self.decided_unsettled)[what[1]] = what[2]
        elif what[0] == "delayed":
            [result] = reply["results"]
            promised = self.sync_flush and result["status"] == "PUT_OK"
            (self.delayed_durable if promised else self.delayed_unsettled)[what[1]] = result["commit_log_offset"]
        elif what[0] == "pop":
            self.on_popped(reply, what[1], what[2])
        elif what[0] == "ack":
            self.on_acked(reply, what[1], what[2], what[3])
        elif what[0] == "pull":
            _, topic, queue_id, epoch = what
            if epoch != self.epochs.get(topic, 0) or topic in self.doubtful:
                return  # about the topic before a deletion, or read while a lost deletion may still happen
            messages = [(m["queue_offset"], bytes(m["body"])) for m in reply.get("messages", [])]
            self.check_pulled(topic, queue_id, messages, "pull")
            self.next_pull[(topic, queue_id)] = reply.get("next_offset", 0)

    def check_pulled(self, topic: str, queue_id: int, messages: list[tuple[int, bytes]], how: str) -> None:
        """What a pull read of a queue: the message stored at each position, the same at every read."""
        for queue_offset, body in messages:
            position = (topic, queue_id, queue_offset)
            if how == "pull":
                self.pulled += 1
            else:
                self.local_pulled += 1
            expected = self.durable.get(position) or self.unsettled.get(position)
            if expected is not None and expected.body != body:
                self.violations.append(f"{how} {position}: a different message than the one stored there")
            if self.seen.get(position, body) != body:
                self.violations.append(f"{how} {position}: changed since it was first pulled")
            self.seen[position] = body

    def forget_topic(self, topic: str, deletion_offset: int) -> None:
        """The topic's messages stored below the deletion offset are gone with it, by design."""
        self.deletions += 1
        self.deleted_below[topic] = deletion_offset
        for table in (self.durable, self.unsettled):
            for position in [p for p in table if p[0] == topic]:
                del table[position]
        self.void_reads(topic)

    def void_reads(self, topic: str) -> None:
        """What was read of the topic no longer holds (a new epoch: older reads' answers are void)."""
        self.epochs[topic] = self.epochs.get(topic, 0) + 1
        for table in (self.seen, self.fifo_open):
            for position in [p for p in table if p[0] == topic]:
                del table[position]
        for acked in [a for a in self.acked_positions if a[1][0] == topic]:
            del self.acked_positions[acked]
        for queue in [q for q in self.next_pull if q[0] == topic]:
            del self.next_pull[queue]

    def power_cut(self, flushed_offset: int) -> None:
        """Answered sends below the flushed offset are on disk; the rest may be gone."""
        for position, stored in self.unsettled.items():
            if stored.commit_log_offset < flushed_offset:
                self.durable[position] = stored
        self.unsettled.clear()
        self.decided_unsettled.clear()  # the cut may take the op record, or the commit
        for body, offset in self.delayed_unsettled.items():
            if offset < flushed_offset:
                self.delayed_durable[body] = offset
        self.delayed_unsettled.clear()
        self.waiting.clear()  # the replies died with the engine
        self.lose_deletion_answers()
        if not self.sync_flush:
            self.seen.clear()  # under ASYNC_FLUSH a reader may have seen what the cut took
            self.next_pull.clear()
            self.acked_positions.clear()  # the cut may take the acks of the last flush interval
            self.fifo_open.clear()  # and the log's tail: offsets may be given to new messages

    def clean_stop(self) -> None:
        """A clean stop flushes every file: all that was answered before it is on disk, in
        either flush mode, and stays there through a power cut before the next start."""
        self.durable.update(self.unsettled)
        self.delayed_durable.update(self.delayed_unsettled)
        self.decided.update(self.decided_unsettled)
        for table in (self.unsettled, self.delayed_unsettled, self.decided_unsettled):
            table.clear()
        self.waiting.clear()  # the front stopped first: what it was relaying is not answered
        self.lose_deletion_answers()

    def kill(self, actor: str) -> None:
        if actor == self.front:  # a writer's death is not enough: the front sends its deletions again
            self.lose_deletion_answers()
            self.route_asked = self.routed
            if self.direct:  # what the front held is lost, what it forwarded may be answered straight
                self.waiting = {i: what for i, what in self.waiting.items() if what[0] != "delete"}
            else:
                self.waiting.clear()  # what the front held or was relaying is lost with it

    def lose_deletion_answers(self) -> None:
        """A deletion whose answer is lost may or may not have happened: its topic's messages are
        expected no more, and the topic is created again (a no-op if it was never deleted)."""
        for topic in sorted(self.deleting):
            self.forget_topic(topic, 0)
            self.doubtful[topic] = self.asked_before_doubt[topic] = next(self.ids)
            self.request("create_topic", ("create",), topic=topic, queue_count=TOPICS[topic])
        self.deleting.clear()

    def settle_doubts(self, request_id: int) -> None:
        """A send asked after a lost deletion answer was stored: the writer took every request the
        front gave it before, that deletion too if it ever reached it. What was read of the topic
        meanwhile may be gone with it: those reads no longer count (a new epoch)."""
        for topic, since in list(self.doubtful.items()):
            if request_id > since:
                del self.doubtful[topic]
                self.void_reads(topic)
