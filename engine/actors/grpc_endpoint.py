"""The gRPC endpoint: RocketMQ 5's ``MessagingService`` (the API its proxy serves) on
``grpc_endpoint``, for the official RocketMQ clients.

It writes no file and holds no state that outlives a call: every call becomes requests of the
client protocol to the front (``engine/gateway``). So a restart loses nothing: calls in flight
fail, and the clients reconnect and retry by themselves. Receipt handles stay valid across a
restart because they are the engine's own.

Unlike the other actors it runs on asyncio, as grpc.aio does: one receive or telemetry stream
per client stays open for long, and a coroutine costs far less than a thread. The runtime duties
of ``engine/actors/base.py`` are kept: heartbeats to the supervisor with the lifecycle, SIGTERM
for a clean stop (calls in flight get a grace period), an exit when the supervisor is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path

import grpc
import zmq
from rocketmq.grpc_protocol import definition_pb2

from engine.actors.base import process_setup, send_heartbeat
from engine.config import StoreConfig, decode_config
from engine.coordination.role import Role
from engine.gateway.handlers import generic_handler
from engine.gateway.link import EngineLink
from engine.gateway.service import MessagingService, grpc_broker
from engine.ipc import endpoints
from engine.ipc.curve import CurveKeys
from engine.ipc.lifecycle import Lifecycle, actor_step
from engine.logs import LOG_DIR
from engine.security.audit import AuditLog
from engine.security.guard import Guard

log = logging.getLogger(__name__)

_STOP_GRACE_S = 1.0
BROKER_NAME = "engine"
_ROLE_CACHE_S = 0.5


class GrpcEndpoint:
    """The process: the gRPC server, its line to the front, the heartbeat."""

    def __init__(self, name: str, run_dir: Path, config: StoreConfig, store_dir: Path) -> None:
        self.name = name
        self.run_dir = run_dir
        self.store_dir = store_dir
        self.config = config
        self.lifecycle = Lifecycle.INIT
        self.service: MessagingService | None = None
        self.link: EngineLink | None = None
        self.stopping = asyncio.Event()
        self.role: Role | None = None
        self.role_read_at = -_ROLE_CACHE_S

    def beat(self, heartbeat: zmq.Socket[bytes]) -> None:
        send_heartbeat(heartbeat, self.name, self.lifecycle, self.detail())

    def detail(self) -> dict[str, int]:
        if self.service is None or self.link is None:
            return {}
        refused = {} if self.service.guard is None else self.service.guard.detail()
        return {"calls": self.service.calls, "in_flight": self.link.in_flight, "timeouts": self.link.timeouts,
                **refused}

    async def run(self, parent: int) -> None:
        cfg = self.config
        context = zmq.Context()
        heartbeat = endpoints.configure(context.socket(zmq.PUSH), hwm=16)
        heartbeat.connect(endpoints.ipc(self.run_dir, endpoints.SUPERVISOR_HEARTBEATS))
        try:
            self.lifecycle = actor_step(self.lifecycle, Lifecycle.RECOVERING)
            self.beat(heartbeat)
            curve = None
            if cfg.curve_enabled:
                curve = CurveKeys.from_files(cfg.curve_server_secret_key_file, cfg.grpc_curve_client_secret_key_file)
            self.link = EngineLink(context, cfg.endpoint, timeout_ms=cfg.grpc_request_timeout_ms, curve=curve,
                                   hwm_messages=cfg.socket_hwm_messages)
            self.link.start()
            server = self.server()
            await server.start()
            self.lifecycle = actor_step(self.lifecycle, Lifecycle.RUNNING)
            log.info("serving RocketMQ 5 gRPC on %s", cfg.grpc_endpoint)
            while not self.stopping.is_set():
                self.beat(heartbeat)
                if os.getppid() != parent:
                    log.error("the supervisor is gone; stopping")
                    break
                try:
                    await asyncio.wait_for(self.stopping.wait(), cfg.heartbeat_interval_ms / 1000)
                except TimeoutError:
                    self.link.drain()  # a safety net: no reply waits on a missed signal past a beat
            self.lifecycle = actor_step(self.lifecycle, Lifecycle.STOPPING)
            self.beat(heartbeat)
            await server.stop(_STOP_GRACE_S)
            self.lifecycle = actor_step(self.lifecycle, Lifecycle.STOPPED)
            self.beat(heartbeat)
        finally:
            if self.link is not None:
                self.link.close()
            context.destroy(linger=0)

    def server(self) -> grpc.aio.Server:
        cfg = self.config
        # Elected on etcd, the broker is the set (its broker_name), as other sets of a cluster are named.
        broker = grpc_broker(cfg.broker_name if cfg.elected else BROKER_NAME, cfg.grpc_endpoint)
        assert self.link is not None
        guard = None
        if cfg.acl_enabled:
            guard = Guard(self.store_dir, AuditLog(self.store_dir / LOG_DIR / f"audit-{self.name}.jsonl",
                                                   bytes_max=cfg.audit_log_bytes_max,
                                                   files_kept=cfg.audit_log_files_kept))
        self.service = MessagingService(self.link, cfg, broker, self.master_broker, guard)
        server = grpc.aio.server(maximum_concurrent_rpcs=cfg.grpc_streams_max, options=[
            ("grpc.max_receive_message_length", cfg.grpc_message_bytes_max),
            ("grpc.max_send_message_length", cfg.grpc_message_bytes_max),
            ("grpc.so_reuseport", 0),
        ])
        server.add_generic_rpc_handlers((generic_handler(self.service),))
        if cfg.grpc_tls_cert_file:
            client_ca = Path(cfg.grpc_tls_client_ca_file).read_bytes() if cfg.grpc_tls_client_ca_file else None
            credentials = grpc.ssl_server_credentials([(Path(cfg.grpc_tls_key_file).read_bytes(),
                                                        Path(cfg.grpc_tls_cert_file).read_bytes())],
                                                      root_certificates=client_ca,
                                                      require_client_auth=client_ca is not None)
            server.add_secure_port(cfg.grpc_endpoint, credentials)
        else:
            server.add_insecure_port(cfg.grpc_endpoint)
        return server


    def master_broker(self) -> definition_pb2.Broker | None:
        """Elected on etcd and a replica: the master's gRPC endpoint, from the role the broker membership
        actor wrote (read again at most every ``_ROLE_CACHE_S``)."""
        if not self.config.elected:
            return None
        now = time.monotonic()
        if now - self.role_read_at > _ROLE_CACHE_S:
            self.role, self.role_read_at = Role.load(self.run_dir), now
        role = self.role
        if role is None or role.is_master or not role.master_grpc_endpoint:
            return None
        # id 0 is what RocketMQ names a master by (MixAll.MASTER_ID): clients send only to id 0's queues.
        return grpc_broker(self.config.broker_name, role.master_grpc_endpoint)


def main(argv: list[str] | None = None) -> int:
    args, parent = process_setup(argv)
    endpoint = GrpcEndpoint(args.name, args.run_dir, decode_config(args.config.read_bytes()), args.store_dir.resolve())

    async def serve() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, endpoint.stopping.set)
        await endpoint.run(parent)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
