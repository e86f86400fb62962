"""Every metric the engine exports: its name, kind, labels and meaning, in one table.

Names follow Prometheus' conventions: an ``rmqpy_`` prefix, the unit in the name
(``_bytes``, ``_seconds``, ``_messages``), ``_total`` on counters. Counters count from
the start of the process that keeps them: an actor's restart resets its own, which
``rate()`` and ``increase()`` take in their stride.

Who reports what (``report.py`` carries it to the monitor):

    writer        sent messages and bytes per queue, send latency, refusals, disk full
    owners        queue offsets, pulled messages and bytes, pop groups' state
    flusher       flush rounds and fdatasync times
    front         requests by op, refusals, committed offsets and members of consumer groups
    monitor       log offsets and the broker set's role and in-sync replicas (shared slots), actors
                  (supervisor), disk, group lag
"""

from __future__ import annotations

from dataclasses import dataclass

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
QUEUE = ("topic", "queue_id")
GROUP_QUEUE = ("group", "topic", "queue_id")
BROKER_SET = ("cluster_name", "broker_name")  # a broker set is named within its cluster


@dataclass(frozen=True)
class Family:
    name: str  # without the _total of a counter (prometheus_client adds it)
    kind: str
    help: str
    labels: tuple[str, ...] = ()


FAMILIES = {f.name: f for f in [
    # queues
    Family("rmqpy_queue_sent_messages", COUNTER, "Messages stored in a queue", QUEUE),
    Family("rmqpy_queue_sent_bytes", COUNTER, "Bytes of records stored in a queue's log", QUEUE),
    Family("rmqpy_queue_pulled_messages", COUNTER, "Messages served from a queue by pulls", QUEUE),
    Family("rmqpy_queue_pulled_bytes", COUNTER, "Bytes of messages served from a queue by pulls", QUEUE),
    Family("rmqpy_queue_min_offset", GAUGE, "First queue offset still stored", QUEUE),
    Family("rmqpy_queue_max_offset", GAUGE, "Next queue offset (messages ever stored in the queue)", QUEUE),
    # consumer groups
    Family("rmqpy_group_committed_offset", GAUGE, "A consumer group's committed offset", GROUP_QUEUE),
    Family("rmqpy_group_lag_messages", GAUGE, "Messages past a consumer group's committed offset", GROUP_QUEUE),
    Family("rmqpy_group_members", GAUGE, "Members of a consumer group sharing a topic's queues (by heartbeat)",
           ("group", "topic")),
    Family("rmqpy_pop_in_flight_messages", GAUGE, "Popped messages not acknowledged yet", GROUP_QUEUE),
    Family("rmqpy_pop_due_messages", GAUGE, "Messages whose invisible time ran out, waiting to be redelivered",
           GROUP_QUEUE),
    Family("rmqpy_pop_redelivered_messages", COUNTER, "Messages delivered again to a pop group", GROUP_QUEUE),
    Family("rmqpy_pop_dead_lettered_messages", GAUGE, "Messages moved to the group's dead-letter topic "
                                                      "(in the loaded segments)", GROUP_QUEUE),
    # the send path
    Family("rmqpy_send_latency_seconds", HISTOGRAM, "From the front taking a send to the writer answering it "
                                                    "(with SYNC_FLUSH, after its flush)", ("flush_mode",)),
    Family("rmqpy_flush_seconds", HISTOGRAM, "One flush of the log, every segment it spans"),
    Family("rmqpy_fdatasync_seconds", HISTOGRAM, "One fdatasync of a log segment"),
    Family("rmqpy_refusals", COUNTER, "Requests refused for the engine's sake, by error code", ("code", "actor")),
    Family("rmqpy_requests", COUNTER, "Client requests taken by the front, by operation, and the sends the writer "
                                      "takes straight from clients", ("op",)),
    Family("rmqpy_disk_full", GAUGE, "1 while the writer refuses sends because the disk is too full"),
    # the log
    Family("rmqpy_log_offset_bytes", GAUGE, "Offsets of the CommitLog: written, confirmed, flushed, dispatched, "
                                            "indexed, and the oldest kept (min)", ("offset",)),
    Family("rmqpy_log_behind_bytes", GAUGE, "How far the flush, the dispatch and the index are behind the "
                                            "confirmed offset", ("stage",)),
    Family("rmqpy_timers_pending_messages", GAUGE, "Delayed messages stored and not delivered yet"),
    Family("rmqpy_transaction_halves_pending_messages", GAUGE, "Half messages without a decision"),
    # the broker set (replication)
    Family("rmqpy_broker_master", GAUGE, "1 while this engine takes writes as its broker set's master: a fixed "
                                         "master, or one elected on etcd that holds its lease", BROKER_SET),
    Family("rmqpy_replication_in_sync_replicas", GAUGE, "Replicas in sync with this master (a master with a "
                                                        "replication endpoint)", BROKER_SET),
    Family("rmqpy_replication_min_in_sync_replicas", GAUGE, "min_in_sync_replicas of a SYNC master: below it, "
                                                            "sends that wait for the replicas are refused",
           BROKER_SET),
    # the host and the actors
    Family("rmqpy_disk_used_ratio", GAUGE, "Used share of the store's file system"),
    Family("rmqpy_disk_free_bytes", GAUGE, "Free bytes on the store's file system"),
    Family("rmqpy_engine_degraded", GAUGE, "1 while the engine is DEGRADED: an actor does not run, or runs and "
                                           "cannot do its work (the reasons: status, /healthz)"),
    Family("rmqpy_actor_condition", GAUGE, "1 while a running actor reports it cannot do its work (a disk that "
                                           "refuses its writes)", ("actor",)),
    Family("rmqpy_actor_up", GAUGE, "1 while an actor runs (RUNNING)", ("actor",)),
    Family("rmqpy_actor_state", GAUGE, "1 for an actor's current lifecycle state", ("actor", "state")),
    Family("rmqpy_actor_restarts", COUNTER, "Restarts of an actor by the supervisor", ("actor",)),
    Family("rmqpy_actor_resident_memory_bytes", GAUGE, "Resident memory of an actor process", ("actor",)),
    Family("rmqpy_actor_open_files", GAUGE, "Open descriptors of an actor process", ("actor",)),
    Family("rmqpy_auth_refusals", COUNTER, "Requests refused by the ACL, by code (UNAUTHENTICATED, FORBIDDEN)",
           ("actor", "code")),
]}

# Upper bounds of the latency histograms, in seconds: 50 us to 10 s.
LATENCY_BOUNDS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 10.0)
