"""A broker set's election state in etcd, and the role it gives this engine.

Keys, under ``/rmqpy/<cluster_name>/<broker_name>/`` (values are JSON)::

    members/<broker_id>          {broker_id, endpoint, replication_endpoint, end_offset}   member's lease
    master                       {broker_id, epoch, endpoint, replication_endpoint,
                                  grpc_endpoint}                                           master's lease
    epochs/<epoch, 10 digits>    {start_offset, broker_id}: where that epoch's log began (the history)
    in_sync                      {epoch, members: [broker_id...]}: the set a master may be elected from
    offers/<epoch>/<broker_id>   {end_offset}: a candidate for that epoch                   member's lease

Every change of ``master``, ``epochs`` and ``in_sync`` is one etcd transaction that compares
revisions (``BrokerSetKeys.claim``, ``publish_in_sync``), so two members never both become master
of one epoch, and a master that lost its key cannot change the set. Election (RocketMQ 5's
controller, Kafka's ISR): when ``master`` is gone (its lease expired), each member of ``in_sync``
offers its log's end for the next epoch; after ``election_wait_ms`` the member with the most
(ties: the lowest broker_id) claims. Every member of ``in_sync`` holds every message a SYNC
master acknowledged, so any of them may be elected; the most caught-up loses the fewest
unacknowledged ones.

The role the engine takes (``engine/coordination/role.py``) is written to the run directory by
the broker membership actor; the supervisor starts the other actors in it.
"""

from __future__ import annotations

from typing import Any

from engine.coordination.etcd import Entry, absent, created_at, modified_at, put


def choose(offers: dict[int, int]) -> int:
    """The candidate to elect: the longest log, then the lowest broker_id."""
    return min(offers, key=lambda broker_id: (-offers[broker_id], broker_id))


class BrokerSetKeys:
    def __init__(self, cluster_name: str, broker_name: str) -> None:
        self.prefix = f"/rmqpy/{cluster_name}/{broker_name}/"
        self.master = self.prefix + "master"
        self.in_sync = self.prefix + "in_sync"
        self.epochs = self.prefix + "epochs/"
        self.members = self.prefix + "members/"

    def member(self, broker_id: int) -> str:
        return f"{self.members}{broker_id}"

    def epoch(self, epoch: int) -> str:
        return f"{self.epochs}{epoch:010d}"

    def offers(self, epoch: int) -> str:
        return f"{self.prefix}offers/{epoch:010d}/"

    def offer(self, epoch: int, broker_id: int) -> str:
        return f"{self.offers(epoch)}{broker_id}"

    def claim(self, *, epoch: int, in_sync: Entry | None, master: dict[str, Any], start_offset: int,
              lease: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The election's transaction: no master, nobody has claimed ``epoch``, and the in-sync set is
        the one the candidate was checked against. The new master's set is itself alone: the others
        join again as they catch up with it (RocketMQ 5 does the same)."""
        compare = [absent(self.master), absent(self.epoch(epoch)),
                   modified_at(self.in_sync, in_sync.mod_revision if in_sync else 0)]
        success = [put(self.master, master, lease=lease),
                   put(self.epoch(epoch), {"start_offset": start_offset, "broker_id": master["broker_id"]}),
                   put(self.in_sync, {"epoch": epoch, "members": [master["broker_id"]]})]
        return compare, success

    def publish_in_sync(self, *, master_revision: int, epoch: int,
                        members: list[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The master's change of its in-sync set: applied only while it still holds ``master``."""
        return ([created_at(self.master, master_revision)],
                [put(self.in_sync, {"epoch": epoch, "members": sorted(members)})])


def history(entries: list[Entry]) -> list[tuple[int, int]]:
    """The set's epochs and where each began, oldest first, from the ``epochs/`` keys."""
    return sorted((int(entry.key.rsplit("/", 1)[-1]), int(entry.value["start_offset"])) for entry in entries)
