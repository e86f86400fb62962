"""etcd members on this machine, for ``cluster start`` and the tests: Debian's ``etcd-server``
(``apt-get install etcd-server``), one process per member, stopped by its pid.

A member listens for clients on ``client_port`` and for its peers on ``peer_port``, all on
loopback; ``--initial-cluster`` names every member, so three started together form one etcd
cluster of three (it answers while two of them run). ``member_health`` asks one member, started
here or not, whether it answers, has a leader and is the leader (``cluster status``).

With ``tls`` (``EtcdTls``: a CA, and a certificate and key it signed) a member serves its clients
and its peers over TLS only and asks each for a certificate the CA signed
(``--client-cert-auth``, ``--peer-client-cert-auth``): whoever has none makes no request at all.
The member's certificate is also the one it shows its peers, and the one the health checks here
show it.
"""

from __future__ import annotations

import functools
import json
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, TypeVar
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

import psutil

from engine.coordination.etcd import EtcdTls

ETCD = "etcd"
_READY_POLL_S = 0.05
T = TypeVar("T")
HEALTH_TIMEOUT_S = 2.0  # one answer of a member; longer: down (a /health just after a quorum is lost takes 1 s)


class EtcdNotInstalled(RuntimeError):
    pass


class EtcdPortInUse(RuntimeError):
    pass


@dataclass
class EtcdMember:
    name: str
    data_dir: Path
    client_port: int
    peer_port: int
    process: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"
    wrapper: tuple[str, ...] = ()  # the words before its command (``ip netns exec NS``: a test bed's host)
    tls: EtcdTls | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.peer_port}"

    def command(self, initial_cluster: str, *, state: str) -> list[str]:
        tls = self.tls
        certificates = [] if tls is None else [
            "--cert-file", tls.cert_file, "--key-file", tls.key_file, "--trusted-ca-file", tls.ca_file,
            "--client-cert-auth", "--peer-cert-file", tls.cert_file, "--peer-key-file", tls.key_file,
            "--peer-trusted-ca-file", tls.ca_file, "--peer-client-cert-auth"]
        return [*self.wrapper, ETCD, "--name", self.name, "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", initial_cluster, "--initial-cluster-state", state,
                "--heartbeat-interval", "100", "--election-timeout", "1000",
                "--pre-vote",  # a member cut off and back does not depose the leader with its higher term
                *certificates]


def member_ports(first_port: int, members: int) -> list[tuple[int, int]]:
    """The (client, peer) ports of ``members`` members from ``first_port`` on: member k's client port is
    ``first_port + 2 k``, its peer port the next (one member: 2379 and 2380, etcd's own)."""
    assert members >= 1 and first_port + 2 * members - 1 <= 65535, (first_port, members)
    return [(first_port + 2 * k, first_port + 2 * k + 1) for k in range(members)]


@dataclass(frozen=True)
class MemberHealth:
    """One member as it answers: ``up`` (it answered), ``healthy`` (its ``/health``: it has a leader
    and serves), ``leader`` (it is the Raft leader), or the reason it did not answer."""
    endpoint: str
    up: bool
    healthy: bool = False
    leader: bool = False
    reason: str = ""


def member_health(client_url: str, timeout_s: float = HEALTH_TIMEOUT_S, *,
                  context: ssl.SSLContext | None = None) -> MemberHealth:
    """``client_url``'s ``/health`` (503 when it has no leader), then its ``maintenance/status``
    through the JSON gateway (its own member id and the leader's: the same when it leads).
    ``context``: TLS with a client certificate, for a member that asks for one."""
    try:
        try:
            with urlopen(client_url + "/health", timeout=timeout_s, context=context) as reply:
                healthy = json.loads(reply.read()).get("health") == "true"
        except HTTPError as exc:  # 503 and {"health": "false"}: it answers, without a leader
            if exc.code != HTTPStatus.SERVICE_UNAVAILABLE:
                raise
            healthy = False
        request = Request(client_url + "/v3/maintenance/status", data=b"{}", method="POST")
        with urlopen(request, timeout=timeout_s, context=context) as reply:
            status = json.loads(reply.read())
    except (URLError, OSError, ValueError) as exc:
        return MemberHealth(client_url, up=False, reason=str(getattr(exc, "reason", exc)))
    leader = str(status.get("leader", "")) == str(status.get("header", {}).get("member_id", "-"))
    return MemberHealth(client_url, up=True, healthy=healthy, leader=leader)


class EtcdCluster:
    """``ports``: one (client, peer) pair per member, on loopback; or ``members`` made by the caller
    (a test bed's hosts), whose ``reach`` runs a call where the members can be reached from."""

    def __init__(self, root: Path, ports: list[tuple[int, int]] | None = None, *,
                 members: list[EtcdMember] | None = None, reach: Callable[[Callable[[], T]], T] | None = None,
                 tls: EtcdTls | None = None) -> None:
        """``tls``: every member made here serves over TLS with it (``EtcdMember.tls``)."""
        if shutil.which(ETCD) is None:
            raise EtcdNotInstalled("etcd is not installed (Debian: apt-get install etcd-server)")
        self.root = root
        self.members = members if members is not None else \
            [EtcdMember(f"etcd-{k}", root / f"etcd-{k}", client, peer, tls=tls)
             for k, (client, peer) in enumerate(ports or [])]
        self.context = tls.context() if tls is not None else None
        self.reach: Callable[[Callable[[], Any]], Any] = reach or (lambda call: call())
        self.initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def endpoints(self) -> str:
        """The value of ``etcd_endpoints``."""
        return ",".join(member.client_url for member in self.members)

    def start(self, timeout_s: float = 20.0) -> None:
        for member in self.members:
            self.start_member(member)
        self.wait_ready(timeout_s)

    def start_member(self, member: EtcdMember) -> None:
        for port in (member.client_port, member.peer_port) if not member.wrapper else ():
            # else the health check could find another etcd (a test bed's host has none but its own)
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as etcd binds: TIME_WAIT is no owner
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    raise EtcdPortInUse(f"port {port} is in use (another etcd?): etcd {member.name} not started") \
                        from None
        member.data_dir.parent.mkdir(parents=True, exist_ok=True)
        state = "existing" if member.data_dir.exists() else "new"
        log = open(self.root / f"{member.name}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            member.process = subprocess.Popen(member.command(self.initial_cluster, state=state),
                                              stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                              start_new_session=True)
        finally:
            log.close()

    def wait_ready(self, timeout_s: float) -> None:
        """Until a running member answers its health check (the cluster has a leader)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for member in self.members:
                if member.process is None or member.process.poll() is not None:
                    continue
                if self.reach(functools.partial(_healthy, member.client_url, self.context)):
                    return
            time.sleep(_READY_POLL_S)
        raise TimeoutError(f"etcd did not become healthy within {timeout_s} s (logs in {self.root})")

    def pids(self) -> list[int]:
        return [member.process.pid for member in self.members if member.process is not None]

    def kill_member(self, k: int) -> None:
        process = self.members[k].process
        if process is not None:
            process.send_signal(signal.SIGKILL)
            process.wait()
            self.members[k].process = None

    def stop(self) -> None:
        """Every member, one after another, the leader last (``stop_pids``)."""
        running = [m for m in self.members if m.process is not None and m.process.poll() is None]
        self.reach(lambda: stop_pids([m.process.pid for m in running if m.process is not None],
                                     [m.client_url for m in running], context=self.context))
        for member in self.members:
            if member.process is not None:
                member.process.wait()
                member.process = None


def _healthy(client_url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urlopen(client_url + "/health", timeout=0.5, context=context) as reply:
            return b'"true"' in reply.read()
    except (URLError, OSError):
        return False


def stop_pids(pids: list[int], endpoints: list[str] | None = None, timeout_s: float = 10.0, *,
              context: ssl.SSLContext | None = None) -> None:
    """Stop etcd members (``cluster stop``: started by an earlier command): SIGTERM, then SIGKILL after
    ``timeout_s``, one after another and the leader last. A leader told to stop first hands its
    leadership to a follower and waits for it, up to etcd's request timeout (7 s here) when the
    followers are stopping too; stopped last, it has no follower left to hand it to and stops at
    once. ``endpoints``: each member's client URL, to find the leader (none: in the order given)."""
    leaders = {pid for pid, url in zip(pids, endpoints, strict=True)
               if member_health(url, context=context).leader} if endpoints \
        else set()
    for pid in sorted(pids, key=lambda pid: pid in leaders):
        try:
            process = psutil.Process(pid)
            if process.name() != ETCD:
                continue
            process.terminate()
            process.wait(timeout_s)
        except psutil.TimeoutExpired:
            process.kill()
        except psutil.Error:
            continue
