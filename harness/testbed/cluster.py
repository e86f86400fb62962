"""A broker set on a test bed: each etcd member and each engine on a host of its own, and the
test process reaching them from a client host.

Every host runs one thing, so each listens on the same well-known ports of its own address
(etcd's 2379 and 2380, the engine's 10911 and its replication port beside it): what tells them
apart is the host, as on machines.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from engine.config import StoreConfig
from harness.broker_set import BrokerSet
from harness.testbed.bed import TestBed
from supervisor.etcd_server import EtcdCluster, EtcdMember
from supervisor.launcher import EngineProcess

ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
ENGINE_PORT = 10911
REPLICATION_PORT = 10912
GRPC_PORT = 8081


def etcd_on(bed: TestBed, root: Path, hosts: Sequence[str], *, client: str) -> EtcdCluster:
    """An etcd member on each of ``hosts`` (not started), reached from host ``client``."""
    members = [EtcdMember(f"etcd-{k}", root / f"etcd-{k}", ETCD_CLIENT_PORT, ETCD_PEER_PORT,
                          host=bed.address(host), wrapper=tuple(bed.prefix(host)))
               for k, host in enumerate(hosts)]
    return EtcdCluster(root, members=members, reach=lambda call: bed.call(client, call))


def engine_on(bed: TestBed, store_dir: Path, config: StoreConfig, host: str, *, client: str,
              environment: dict[str, str] | None = None, **settings: object) -> EngineProcess:
    """An engine on ``host`` (not started), reached from host ``client``; ``config`` with ``settings``,
    its processes with the host's (``TestBed.environment``) and ``environment`` added to theirs."""
    address = bed.address(host)
    environment = {**bed.environment(host), **(environment or {})}
    wrapper = [*bed.prefix(host), *(["env", *(f"{k}={v}" for k, v in environment.items())] if environment else [])]
    return EngineProcess(store_dir, config=config.replace(
        store_host=address, replication_endpoint=f"tcp://{address}:{REPLICATION_PORT}",
        grpc_endpoint=f"{address}:{GRPC_PORT}", metrics_endpoint="", bind_non_loopback=True, **settings),
        host=address, port=ENGINE_PORT, wrapper=wrapper, context=bed.context(client))


@contextmanager
def broker_set_on(bed: TestBed, root: Path, config: StoreConfig, *, engines: Sequence[str], etcd: Sequence[str],
                  client: str, broker_name: str = "broker-a",
                  environment: dict[str, str] | None = None) -> Iterator[BrokerSet]:
    """etcd's members, then the engines in ``broker_id`` order (the first is elected master), each
    on its host (with ``environment``); all stopped at the end."""
    members = etcd_on(bed, root / "etcd", etcd, client=client)
    members.start()
    started: list[EngineProcess] = []
    try:
        for broker_id, host in enumerate(engines):
            engine = engine_on(bed, root / f"broker-{broker_id}", config, host, client=client, environment=environment,
                               etcd_endpoints=members.endpoints, broker_id=broker_id, broker_name=broker_name)
            engine.start()
            started.append(engine)
        yield BrokerSet(members, started, context=bed.context(client))
    finally:
        for engine in reversed(started):
            engine.stop()
        members.stop()
