"""Which actors make up the engine, in which order they start, and their restart policy.

Start order follows what each actor's recovery reads, in waves; the actors of one wave
start together, and the next wave starts once all of them run:

0. elected on etcd (``etcd_endpoints``): the broker membership actor, which decides the role
   (master or replica) the others start in;
1. the writer recovers the log tail (and publishes the confirmed offset);
2. the flusher flushes it and brings the checkpoint within the log; a master's replication
   sender (with ``replication_endpoint``) starts beside it: it reads only the log the writer
   recovered and the config files, and a new master's replicas follow it while the rest of the
   engine starts (a SYNC master answers no send before one of them holds it);
3. the queue owners and the index builder rebuild what the log holds beyond their files
   (each from the checkpoint, each its own files), and the timer and the transaction actor
   load their own files (they read only the confirmed offset);
4. the reput dispatcher resumes from what the owners and the index builder hold;
5. the front opens the client endpoint (and the internal port, where the timer and the
   transaction actor are already bound for it);
6. the gRPC endpoint (when on), a client of the front, the monitor (metrics and the
   dashboard, when on), which reads what the others report, and a replica's receiver
   (``replica_of``).

Stop order is the reverse, wave by wave: every actor of a wave is sent SIGTERM at once, and the
next (lower) wave is signalled once all of them exited. So the dispatcher drains before the
owners stop, and the writer's last bytes are flushed at the end.

The table lives in the engine, below the supervisor that runs it, because the simulation
(``harness/simulation/world.py``) runs the same actors in the same waves.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import StoreConfig

MEMBERSHIP = "membership"  # elected on etcd: it decides the role the others start in (wave 0)
RECEIVER = "replication-receiver"  # a replica's: the one actor a replica following a new master may replace alone


@dataclass(frozen=True)
class ActorSpec:
    name: str
    module: str
    instance: int = 0
    wave: int = 0  # actors of one wave start together (see above)


def actor_specs(config: StoreConfig) -> list[ActorSpec]:
    owners = [ActorSpec(f"owner-{k}", "engine.actors.consume_queue_owner", k, wave=3)
              for k in range(config.consume_queue_owner_count)]
    # A replica's timer and transaction actor would deliver and decide what its master does: they
    # do not run there (docs/replication.md); it takes its log from its master instead.
    master_only = [] if config.is_replica else [ActorSpec("timer", "engine.actors.timer", wave=3),
                                                ActorSpec("transactions", "engine.actors.transactions", wave=3)]
    replication = []
    if config.is_replica:
        replication = [ActorSpec(RECEIVER, "engine.actors.replication_receiver", wave=6)]
    elif config.replication_endpoint:
        replication = [ActorSpec("replication-sender", "engine.actors.replication_sender", wave=2)]
    return [
        *([ActorSpec(MEMBERSHIP, "engine.actors.broker_membership", wave=0)] if config.elected else []),
        ActorSpec("writer", "engine.actors.commit_log_writer", wave=1),
        ActorSpec("flusher", "engine.actors.flusher", wave=2),
        *owners,
        ActorSpec("index", "engine.actors.index_builder", wave=3),
        *master_only,
        ActorSpec("reput", "engine.actors.reput_dispatcher", wave=4),
        ActorSpec("front", "engine.actors.front", wave=5),
        *replication,
        *([ActorSpec("grpc", "engine.actors.grpc_endpoint", wave=6)] if config.grpc_enabled else []),
        *([ActorSpec("monitor", "engine.actors.monitor", wave=6)]
          if config.metrics_endpoint or config.dashboard_endpoint else []),
    ]
