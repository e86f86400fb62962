"""Consumer groups as the front sees them: the offsets they commit, and the one rule that
ties the two ways of consuming a topic.

A (group, topic) either commits offsets (``commit_offset``/``fetch_offset``, the offsets in
``config/consumerOffset.json``, ``engine/store/consumer_offsets.py``) or pops and acks each
message (a pop group, whose ack state the queues' owners keep): never both, since an ack
and an offset would each say a different thing about what the group consumed. A pop of a
pair that commits offsets, and a commit of a pair that pops, are refused with
GROUP_MODE_CONFLICT. The pairs that pop are those with pop state on disk, and every pop
since the front started.

Commits go to memory at once and to the file every ``consumer_offset_persist_interval_ms``
(``persist_due``), with the topic table after a topic deletion, and at a clean stop.

A group that commits offsets may also share a topic's queues among its members, by their
heartbeats (``engine/services/front/group_members.py``); a pop group has nothing to share.

Called by the front (``engine/actors/front.py``): ``pop_group`` for every pop, ack,
change_invisible and pop_stats; ``commit``/``fetch`` for the offset requests; ``heartbeat``;
``forget_topic`` when a deletion is recorded.
"""

from __future__ import annotations

import logging
from pathlib import Path

from engine.config import StoreConfig
from engine.errors import ErrorCode, RequestError
from engine.ipc.protocol import CommitOffsetRequest, Envelope, FetchOffsetRequest, HeartbeatRequest, encode_reply
from engine.names import validate_group
from engine.services.front.group_members import GroupMembers
from engine.store.consumer_offsets import ConsumerOffsets
from engine.store.pop_files import POP_DIR
from engine.store.sharing_groups import SharingGroups

log = logging.getLogger(__name__)


class ConsumerGroups:
    """Committed offsets, the (group, topic) pairs that pop, and their persistence."""

    def __init__(self, store_dir: Path, config: StoreConfig, now_ms: int) -> None:
        self.config = config
        self.offsets = ConsumerOffsets(store_dir, entries_max=config.consumer_offset_entries_max)
        # (group, topic) pairs that pop: from the pop state's directories, and every pop since
        self.popping = {(path.parent.name, path.name) for path in (store_dir / POP_DIR).glob("*/*")}
        self.last_persist_ms = 0
        self.last_expire_ms = 0
        self.sharing = SharingGroups(store_dir)  # the groups with members, for the next start
        self.members = GroupMembers(config.consumer_session_timeout_ms, config.consumer_group_members_max,
                                    started_ms=now_ms, inherited=self.sharing.pairs)

    def pop_group(self, envelope: Envelope) -> str:
        """The group of a pop (or ack, ...), once checked: it may not be one that commits offsets."""
        group = envelope.group
        if not isinstance(group, str):
            raise RequestError(ErrorCode.INVALID_FIELD, "the field 'group' is required and must be a string")
        validate_group(group)
        if f"{envelope.topic}@{group}" in self.offsets.table:
            raise RequestError(ErrorCode.GROUP_MODE_CONFLICT,
                               f"group {group!r} commits offsets on topic {envelope.topic!r}: it cannot pop it too "
                               f"(use another group)")
        return group

    def popped(self, group: str, topic: str) -> None:
        """A pop of ``topic`` by ``group`` is routed: the pair pops from now on."""
        self.popping.add((group, topic))

    def commit(self, request: CommitOffsetRequest) -> bytes:
        self._not_popping(request.group, request.topic, "has no offsets to commit")
        self.offsets.commit(request.group, request.topic, request.queue_id, request.offset)
        return encode_reply(request.id)

    def fetch(self, request: FetchOffsetRequest) -> bytes:
        return encode_reply(request.id, offset=self.offsets.fetch(request.group, request.topic, request.queue_id))

    def heartbeat(self, request: HeartbeatRequest, now_ms: int, queue_count: int) -> bytes:
        """A member's heartbeat: the reply names the group's live members, the queues granted to the
        member, the topic's queue count and the session timeout (members beat every third of it)."""
        validate_group(request.group)
        self._not_popping(request.group, request.topic, "has no queues to share")
        beyond = [queue_id for queue_id in (*request.queues, *request.held) if queue_id >= queue_count]
        if beyond:
            raise RequestError(ErrorCode.QUEUE_NOT_FOUND, f"topic {request.topic!r} has queues 0..{queue_count - 1}, "
                                                          f"not {beyond[0]}")
        membership = self.members.beat(request.group, request.topic, request.client_id, now_ms,
                                       queues=request.queues, held=request.held, seq=request.seq,
                                       leaving=request.leaving)
        if not request.leaving and self.sharing.add(request.group, request.topic):
            try:  # on disk before its first grant: after a crash the restarted front waits a session for it
                self.sharing.persist()
            except OSError as exc:
                log.error("cannot write the sharing groups: %s; retried with the offsets", exc)
        return encode_reply(request.id, members=membership.members, settled=membership.settled,
                            granted=membership.granted, queue_count=queue_count,
                            session_timeout_ms=self.members.session_timeout_ms)

    def _not_popping(self, group: str, topic: str, what: str) -> None:
        if (group, topic) in self.popping:
            raise RequestError(ErrorCode.GROUP_MODE_CONFLICT,
                               f"group {group!r} pops topic {topic!r}: it {what} (use another group)")

    def forget_topic(self, topic: str) -> int:
        """The topic was deleted: its groups' offsets go, its members, and its pop groups; how many
        offset groups."""
        self.members.forget_topic(topic)
        for group, name in list(self.sharing.pairs):
            if name == topic:
                self.sharing.discard(group, name)
        self.popping = {(group, name) for group, name in self.popping if name != topic}
        return self.offsets.forget_topic(topic)

    def persist_due(self, now_ms: int) -> None:
        """Every ``consumer_offset_persist_interval_ms``, the offsets go to disk."""
        if now_ms - self.last_persist_ms >= self.config.consumer_offset_persist_interval_ms:
            self.last_persist_ms = now_ms
            self.persist()

    def expire_members_due(self, now_ms: int) -> None:
        """Once a session timeout, the ended sessions of members sharing queues go."""
        if now_ms - self.last_expire_ms >= self.members.session_timeout_ms:
            self.last_expire_ms = now_ms
            for group, topic in self.members.expire(now_ms):
                self.sharing.discard(group, topic)

    def persist(self) -> None:
        try:
            self.offsets.persist()
            self.sharing.persist()
        except OSError as exc:
            log.error("cannot persist consumer offsets: %s; kept in memory, retried", exc)

    def committed_rows(self) -> list[list[str | int]]:
        """``rmqpy_group_committed_offset``: [group, topic, queue id, offset] for each committed offset."""
        return [[key.partition("@")[2], key.partition("@")[0], queue_id, offset]
                for key, queues in self.offsets.table.items() for queue_id, offset in queues.items()]
