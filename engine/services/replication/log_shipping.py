"""A master's side of replication: what each replica has, and the log bytes it is sent next.

RocketMQ's HA (``DefaultHAConnection``): a replica reports where its log ends; the master
sends its log from there, a chunk at a time, and the replica appends each chunk only at its
own end. Here a chunk is whole records (a segment's blank tail whole, never across a
segment's end), at most ``replication_chunk_bytes_max`` unless one record is larger, and at
most ``replication_chunks_in_flight_max`` chunks are unreported at a time. A replica that
stops hearing chunks while behind reports again with ``restart``: the master sends from its
end again (a lost chunk, a replica restarted, its writer refusing bytes not for its end). A
replica can also not know it is behind (the chunks that said how far the master is were lost
with a broken connection): when it reports the same end for ``RESEND_AFTER_REPORTS`` report
intervals after a chunk went unreported, the master sends from that end again. Only confirmed
bytes are sent: a replica never holds a record its master could still lose in a crash of
the writer alone.

Bytes are read from the segment files with ``pread``, not through a mapping: retention may
delete a segment while a chunk is read from it, and an open descriptor keeps its bytes.

The master's deletion table goes to a replica before the first chunk past a new deletion
(``deletion_table_change``). Its other config files (topics, consumers' offsets) go to each
replica whole when they change (RocketMQ's ``SlaveSynchronize`` pulls the same files): a
failover can give back the offsets committed in the last ``replication_config_interval_ms``.

A replica is in sync while its log held all its master's within the last
``replica_lag_max_ms`` (a chunk that reached the master's end when sent, reported written).
Under SYNC replication the sender publishes what every in-sync replica holds (the
``replicated`` slot, which only grows) and how many are in sync; the writer answers sends
by it, and readers see no further.

Used by the replication sender (``engine/actors/replication_sender.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import StoreConfig
from engine.ipc.wire import Origin
from engine.layout import MAGIC_BLANK, TOTAL_SIZE_AND_MAGIC, offset_to_file_name
from engine.security.acl import ACL_FILE
from engine.store.commit_log import COMMIT_LOG_DIR
from engine.store.consumer_offsets import OFFSETS_FILE
from engine.store.deleted_topics import DELETED_TOPICS_FILE, parse_table, table_crc
from engine.store.sharing_groups import SHARING_GROUPS_FILE
from engine.store.topics import TOPICS_FILE

SHIPPED_CONFIG_FILES = (TOPICS_FILE, OFFSETS_FILE, SHARING_GROUPS_FILE)
# Shipped too when the channel is encrypted (replication_curve_secret_key_file): the users and
# policies, secrets included, are the set's; a replica writes them for its owner only.
SECRET_CONFIG_FILES = (ACL_FILE,)
RESEND_AFTER_REPORTS = 5


@dataclass
class Replica:
    """One connected replica, by the routing id of its connection."""

    origin: Origin
    reported: int  # its log's end, as it last said
    next_offset: int  # where the next chunk starts
    heard_ms: int
    # the chunks sent and not yet reported: (end, whether it reached the master's end, when sent)
    in_flight: list[tuple[int, bool, int]] = field(default_factory=list)
    caught_up_ms: int | None = None  # when its log last held all the master's (None: never yet)
    follow: int = 0  # the report that began this follow: every answer carries it
    deletions_crc: int = field(default_factory=lambda: table_crc({}))  # of the deletion table sent it last
    config_sent: dict[Path, tuple[int, int, int]] = field(default_factory=dict)  # file -> (inode, mtime ns, size)
    broker_id: int = -1  # elected on etcd: which member of the broker set it is


class LogShipping:
    """The replicas of this master and the chunks each is sent."""

    def __init__(self, store_dir: Path, config: StoreConfig) -> None:
        self.store_dir = store_dir
        self.config = config
        self.shipped = SHIPPED_CONFIG_FILES + (SECRET_CONFIG_FILES if config.replication_curve_secret_key_file else ())
        self.replicas: dict[bytes, Replica] = {}
        self._fds: dict[int, int] = {}  # segment start -> read descriptor

    def report(self, origin: Origin, end_offset: int, *, restart: bool, confirmed: int, min_offset: int,
               now_ms: int, follow: int = 0) -> Replica | str:
        """A replica's report; the refusal's reason when this master cannot send it its log."""
        if end_offset > confirmed:
            return (f"the replica's log ends at {end_offset}, past this master's ({confirmed}): it holds records "
                    f"this master does not; give it an empty store to follow this master")
        if 0 < end_offset < min_offset:
            return (f"the replica's log ends at {end_offset}, below this master's oldest segment ({min_offset}): "
                    f"give it an empty store to follow this master")
        replica = self.replicas.get(origin.peer)
        start = end_offset if end_offset else min_offset
        if replica is None or restart or follow != replica.follow:  # a follow whose first report was lost too
            replica = self.replicas[origin.peer] = Replica(origin, end_offset, start, now_ms, follow=follow)
        elif replica.in_flight and end_offset == replica.reported and \
                now_ms - replica.in_flight[0][2] >= RESEND_AFTER_REPORTS * self.config.replication_report_interval_ms:
            replica.in_flight, replica.next_offset = [], start  # those chunks were lost: from its end again
        for end, reached_master_end, sent_ms in replica.in_flight:
            if end <= end_offset and reached_master_end:  # it then held all the master had when sent
                replica.caught_up_ms = max(replica.caught_up_ms or 0, sent_ms)
        if end_offset >= confirmed:
            replica.caught_up_ms = now_ms
        replica.in_flight = [chunk for chunk in replica.in_flight if chunk[0] > end_offset]
        replica.reported, replica.heard_ms = end_offset, now_ms
        replica.next_offset = max(replica.next_offset, start)
        return replica

    def chunks(self, replica: Replica, confirmed: int, now_ms: int = 0) -> Iterator[tuple[int, bytes]]:
        """The chunks to send ``replica`` now: (offset, bytes), within the in-flight limit."""
        while len(replica.in_flight) < self.config.replication_chunks_in_flight_max \
                and replica.next_offset < confirmed:
            data = self.read_chunk(replica.next_offset, confirmed)
            if not data:
                return
            yield replica.next_offset, data
            replica.next_offset += len(data)
            replica.in_flight.append((replica.next_offset, replica.next_offset == confirmed, now_ms))

    def read_chunk(self, start: int, confirmed: int) -> bytes:
        """Whole records from ``start``, up to ``confirmed`` and the segment's end."""
        size_bytes = self.config.segment_size_bytes
        segment_start = start - start % size_bytes
        segment_end = segment_start + size_bytes
        fd = self._fd(segment_start)
        if fd is None:
            return b""
        window = min(confirmed, segment_end) - start
        data = os.pread(fd, min(window, self.config.replication_chunk_bytes_max), start - segment_start)
        pos = 0
        while len(data) - pos >= TOTAL_SIZE_AND_MAGIC.size:
            size, magic = TOTAL_SIZE_AND_MAGIC.unpack_from(data, pos)
            if magic == MAGIC_BLANK and size == segment_end - (start + pos):  # the tail, whole, alone
                return data[:pos] if pos else os.pread(fd, size, start - segment_start)
            if size <= 0 or pos + size > window:
                break  # never past confirmed (a record there is not whole yet)
            if pos + size > len(data):
                if pos == 0:  # one record larger than a chunk goes alone
                    return os.pread(fd, size, start - segment_start)
                break
            pos += size
        return data[:pos]

    def _fd(self, segment_start: int) -> int | None:
        fd = self._fds.get(segment_start)
        if fd is None:
            for start in [start for start in self._fds if start < segment_start - self.config.segment_size_bytes]:
                os.close(self._fds.pop(start))
            try:
                fd = os.open(self.store_dir / COMMIT_LOG_DIR / offset_to_file_name(segment_start), os.O_RDONLY)
            except FileNotFoundError:
                return None
            self._fds[segment_start] = fd
        return fd

    def deletion_table_change(self, replica: Replica) -> bytes | None:
        """The deletion table, if it changed since ``replica`` was last sent it. Looked at after
        the confirmed offset is read: the writer saves a deletion before it appends any record
        past it, so a replica gets the table before those records."""
        data = next((data for _name, data in self._changed(replica, (DELETED_TOPICS_FILE,))), None)
        if data is not None:
            try:
                replica.deletions_crc = table_crc(parse_table(data))
            except ValueError:  # written whole by the writer: a half-read file is none of ours
                return None
        return data

    def config_changes(self, replica: Replica) -> Iterator[tuple[str, bytes]]:
        """The config files that changed since ``replica`` was last sent them: (name, bytes)."""
        return self._changed(replica, self.shipped)

    def _changed(self, replica: Replica, files: tuple[Path, ...]) -> Iterator[tuple[str, bytes]]:
        for relative in files:
            path = self.store_dir / relative
            try:
                stat = path.stat()
                seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
                if replica.config_sent.get(relative) == seen:
                    continue
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            replica.config_sent[relative] = seen
            yield relative.name, data

    def in_sync(self, now_ms: int) -> list[Replica]:
        """The in-sync set (Kafka's ISR, RocketMQ's SyncStateSet): the replicas whose log held all
        the master's within the last ``replica_lag_max_ms``."""
        lag_max = self.config.replica_lag_max_ms
        return [replica for replica in self.replicas.values()
                if replica.caught_up_ms is not None and now_ms - replica.caught_up_ms <= lag_max]

    def forget(self, peer: bytes) -> Replica | None:
        """Forget the replica of connection ``peer`` (it broke): out of the in-sync set at once; it
        reconnects with a report."""
        return self.replicas.pop(peer, None)

    def drop_silent(self, now_ms: int) -> list[Replica]:
        """Forget the replicas not heard from for ``replica_silence_ms_max``: they reconnect with a report."""
        silent = [r for r in self.replicas.values() if now_ms - r.heard_ms > self.config.replica_silence_ms_max]
        for replica in silent:
            del self.replicas[replica.origin.peer]
        return silent

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
