"""Which actors make up the engine, in which order they start, and their restart policy.

Start order follows what each actor's recovery reads: the writer recovers the
log tail first (and publishes the confirmed offset), the flusher follows it,
queue owners and the index builder rebuild what the log holds beyond their
files, the reput dispatcher resumes from what they hold, and the front opens
the client endpoint, after the timer and the transaction actor (clients of the
front on its internal port, and served by it: the front finds them bound); the
gRPC endpoint (when on), a client of the front, comes last. Stop order is the
reverse, so the dispatcher drains before the owners stop, and the writer's last bytes are flushed at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import StoreConfig


@dataclass(frozen=True)
class ActorSpec:
    name: str
    module: str
    instance: int = 0


def actor_specs(config: StoreConfig) -> list[ActorSpec]:
    owners = [ActorSpec(f"owner-{k}", "engine.actors.consume_queue_owner", k)
              for k in range(config.consume_queue_owner_count)]
    return [
        ActorSpec("writer", "engine.actors.commit_log_writer"),
        ActorSpec("flusher", "engine.actors.flusher"),
        *owners,
        ActorSpec("index", "engine.actors.index_builder"),
        ActorSpec("reput", "engine.actors.reput_dispatcher"),
        ActorSpec("timer", "engine.actors.timer"),
        ActorSpec("transactions", "engine.actors.transactions"),
        ActorSpec("front", "engine.actors.front"),
        *([ActorSpec("grpc", "engine.actors.grpc_endpoint")] if config.grpc_enabled else []),
    ]
