"""The replication sender: a master's end of RocketMQ's HA (``DefaultHAService``).

Replicas connect to ``replication_endpoint`` (ROUTER, tcp) and report where their logs end
(``ReplicaReport``); this actor sends each its log from there in chunks of whole records
(``LogChunk`` and the bytes), as far as the log is confirmed, a few chunks ahead of what
the replica reported written (``engine/services/replication/log_shipping.py``). The writer's
``confirmed`` wake-ups say when there is more to send; every tick sends what a lost wake-up
left, the config files that changed (topics, consumers' offsets: ``ConfigSnapshot``) every
``replication_config_interval_ms``, and forgets replicas silent for ``replica_silence_ms_max``.
A replica whose connection breaks is forgotten at once (``peer_lost``: the socket's monitor; ZMTP
heartbeats close a link silent for ``replication_heartbeat_timeout_ms``, a replica paused or cut off).

Under SYNC replication it keeps the in-sync set (``LogShipping.in_sync``) and publishes how
many replicas are in it and what all of them hold (the ``replicated`` slot), waking the writer
(``replicated``) when either changes: the writer answers the sends that wait for them.

It holds nothing on disk: a restarted sender knows no replica until each reports again, at
least every ``replication_report_interval_ms`` (meanwhile none is in sync).
"""

from __future__ import annotations

import logging

from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects
from engine.coordination.role import Role, mask, members_of
from engine.ipc import channels, endpoints
from engine.ipc.channels import Channel
from engine.ipc.messages import (
    ConfigSnapshot,
    ConfirmOffset,
    LogChunk,
    MasterEndpoint,
    ReplicaRefused,
    ReplicaReport,
    Wake,
    encoder,
)
from engine.ipc.wire import Inbound
from engine.logs import event
from engine.services.replication.log_shipping import LogShipping, Replica
from engine.store.deleted_topics import DELETED_TOPICS_FILE
from engine.store.shared_offsets import (
    CONFIRMED,
    EPOCH,
    IN_SYNC_IDS,
    IN_SYNC_PUBLISHED,
    IN_SYNC_REPLICAS,
    MIN_OFFSET,
    REPLICATED,
)

log = logging.getLogger(__name__)
_WAKE = encoder.encode(Wake())


class ReplicationSenderActor(Actor):
    """Takes ``ReplicaReport`` on ``replication`` and ``Wake`` on ``confirmed``; gives ``LogChunk``s,
    ``ConfigSnapshot``s and ``ReplicaRefused`` on ``replication``."""

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.shipping = LogShipping(env.store_dir, env.config)
        self.last_config_ms = 0
        self.bytes_sent = 0
        self.refusals = 0
        self.epoch_known = (0, 0)  # an epoch and where it began (``epoch_start``)

    def ports(self) -> list[Port]:
        return [Port(channels.REPLICATION, bind=True, address=self.config.replication_endpoint,
                     max_message_bytes=self.config.client_frame_bytes_max, peers_monitored=True, set_key=True,
                     heartbeat_timeout_ms=self.config.replication_heartbeat_timeout_ms),
                Port(channels.CONFIRMED, bind=False, subscribe=(endpoints.TOPIC_CONFIRMED,)),
                Port(channels.REPLICATED, bind=True)]

    def recover(self, out: Effects) -> None:
        self.slots.set(IN_SYNC_REPLICAS, 0)  # none until each reports again

    def handlers(self) -> dict[type, Handler]:
        return {ReplicaReport: self.on_report, Wake: self.on_confirmed}

    def on_report(self, report: ReplicaReport, inbound: Inbound, out: Effects) -> None:
        assert inbound.origin is not None
        now_ms = self.clock.mono_ms()
        previous = self.shipping.replicas.get(inbound.origin.peer)
        replica = self.shipping.report(inbound.origin, report.end_offset, restart=report.restart,
                                       confirmed=self.slots.get(CONFIRMED), min_offset=self.slots.get(MIN_OFFSET),
                                       now_ms=now_ms, follow=report.follow)
        epoch = self.slots.get(EPOCH)
        if isinstance(replica, Replica) and report.epoch > epoch:
            replica = (f"this engine was master of epoch {epoch}; the replica follows epoch {report.epoch}: "
                       f"its master is another")
        if isinstance(replica, str):
            self.refusals += 1
            log.error("a replica cannot follow: %s", replica, extra=event("replication.refused", reason=replica))
            out.reply(inbound.origin, b"", ReplicaRefused(replica))
            return
        replica.broker_id = report.broker_id
        if replica is not previous:  # the report began a follow
            log.info("a replica follows from %d", report.end_offset,
                     extra=event("replication.follow", end_offset=report.end_offset))
            out.reply(replica.origin, b"", MasterEndpoint(self.config.advertised_endpoint, replica.follow))
            out.reply(replica.origin, b"", ConfirmOffset(self.slots.get(REPLICATED), replica.follow))
            self.send_config(replica, out)
        self.send_log(replica, out)
        self.publish_in_sync(out)

    def peer_lost(self, channel: Channel, peer: bytes, out: Effects) -> None:
        """A replica's connection broke (it died, or its link was silent past the heartbeat timeout):
        out of the in-sync set now, not after ``replica_silence_ms_max``."""
        replica = self.shipping.forget(peer)
        if replica is not None:
            log.warning("a replica's connection broke (last at %d): out of the in-sync set until it reports again",
                        replica.reported, extra=event("replication.replica_lost", broker_id=replica.broker_id))
            self.publish_in_sync(out)

    def publish_in_sync(self, out: Effects) -> None:
        """The in-sync set's count and what all of it holds, into the slots; the writer is woken
        when either changed (SYNC replication answers sends and bounds readers by them)."""
        in_sync = self.shipping.in_sync(self.clock.mono_ms())
        held = min((replica.reported for replica in in_sync), default=0)
        if self.config.elected:  # the set etcd holds, too: a replica leaves it there first (broker_membership)
            self.slots.set(IN_SYNC_IDS, mask([replica.broker_id for replica in in_sync if replica.broker_id >= 0]))
            connected = {replica.broker_id: replica.reported for replica in self.shipping.replicas.values()}
            for broker_id in members_of(self.slots.get(IN_SYNC_PUBLISHED)):
                if broker_id != self.config.broker_id:
                    held = min(held, connected.get(broker_id, 0))
        replicated = max(self.slots.get(REPLICATED), held)
        if (len(in_sync), replicated) == (self.slots.get(IN_SYNC_REPLICAS), self.slots.get(REPLICATED)):
            return
        if len(in_sync) != self.slots.get(IN_SYNC_REPLICAS):
            log.info("%d replicas in sync", len(in_sync), extra=event("replication.in_sync", count=len(in_sync)))
        self.slots.set(IN_SYNC_REPLICAS, len(in_sync))
        self.slots.set(REPLICATED, replicated)
        out.publish(channels.REPLICATED, endpoints.TOPIC_REPLICATED, _WAKE)
        if self.config.reads_wait_for_replicas:  # the replicas' readers stop there too
            for replica in self.shipping.replicas.values():
                out.reply(replica.origin, b"", ConfirmOffset(replicated, replica.follow))

    def on_confirmed(self, _wake: Wake, _inbound: Inbound, out: Effects) -> None:
        for replica in self.shipping.replicas.values():
            self.send_log(replica, out)

    def send_log(self, replica: Replica, out: Effects) -> None:
        confirmed = self.slots.get(CONFIRMED)  # first: the deletion table read after it covers its records
        table = self.shipping.deletion_table_change(replica)
        if table is not None:
            out.reply(replica.origin, table, ConfigSnapshot(DELETED_TOPICS_FILE.name, replica.follow))
        for offset, data in self.shipping.chunks(replica, confirmed, self.clock.mono_ms()):
            self.bytes_sent += len(data)
            epoch = self.slots.get(EPOCH)
            out.reply(replica.origin, data, LogChunk(offset, confirmed, replica.follow, replica.deletions_crc,
                                                     epoch, self.epoch_start(epoch, offset)))

    def epoch_start(self, epoch: int, offset: int) -> int:
        """Where ``epoch`` began in the set's log, from the role the membership actor wrote before it
        set the epoch's slot (a master elected again keeps its actors: the epoch changes under them)."""
        if not self.config.elected:
            return 0
        if epoch != self.epoch_known[0]:
            role = Role.load(self.env.run_dir)
            start = dict(role.history).get(epoch) if role is not None else None
            if start is None:
                return offset  # the role not written yet: this chunk's
            self.epoch_known = (epoch, start)
        return self.epoch_known[1]

    def send_config(self, replica: Replica, out: Effects) -> None:
        for name, data in self.shipping.config_changes(replica):
            out.reply(replica.origin, data, ConfigSnapshot(name, replica.follow))

    def tick(self, out: Effects) -> None:
        now_ms = self.clock.mono_ms()
        for replica in self.shipping.drop_silent(now_ms):
            log.warning("a replica (last at %d) was silent for %d ms and is forgotten until it reports again",
                        replica.reported, self.config.replica_silence_ms_max)
        config_due = now_ms - self.last_config_ms >= self.config.replication_config_interval_ms
        if config_due:
            self.last_config_ms = now_ms
        for replica in self.shipping.replicas.values():
            if config_due:
                self.send_config(replica, out)
            self.send_log(replica, out)
        self.publish_in_sync(out)  # a replica falls out of sync by time alone

    def detail(self) -> dict[str, int]:
        confirmed = self.slots.get(CONFIRMED)
        lags = [confirmed - replica.reported for replica in self.shipping.replicas.values()]
        return {"replicas": len(lags), "replica_lag_bytes_max": max(lags, default=0), "bytes_sent": self.bytes_sent,
                "refusals": self.refusals}

    def shutdown(self, out: Effects) -> None:
        self.shipping.close()


if __name__ == "__main__":
    raise SystemExit(main(ReplicationSenderActor))
