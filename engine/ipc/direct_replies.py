"""Answers that go from the actor that made them straight to the client, past the front.

A send's answer is made by the writer, a pull's by an owner; the front only relays them. With
``direct_replies_enabled`` each of those actors binds a ROUTER of its own beside the front's
(``channels.replies``), on the front's host, and a client that asks (``StoreClient``) connects its
socket to them under the routing id it gives the front. The front forwards a request as before,
with that id; the actor answers on its own ROUTER when the client is connected to it there, and
through the front otherwise (not connected yet, gone, its queue full: ZeroMQ's ROUTER_MANDATORY
says so at once). Nothing is lost either way: a client matches answers to requests by id, from
whichever peer they come.

Where each actor listens is a file of the run directory, ``replies-<actor>.endpoint``, read by
the front for its ``route`` answer (``reply_endpoints``). Over tcp an actor takes a port the
system gives and keeps it over its restarts (it binds the port of its file first), so that
clients reconnect to it; over ipc, a file of the run directory.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import zmq

from engine.ipc import endpoints

log = logging.getLogger(__name__)

_SUFFIX = ".endpoint"
_RESERVED_RETRIES_MAX = 16
_PREFIX = "replies-"
_ANY_HOST = ("*", "0.0.0.0", "[::]", "[*]")
_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]*\]|[^:]*):(?P<port>\d+|\*)$")


def endpoint_file(run_dir: Path, actor: str) -> Path:
    return run_dir / f"{_PREFIX}{actor}{_SUFFIX}"


def bind_addresses(front_endpoint: str, run_dir: Path, actor: str) -> list[str]:
    """Where ``actor`` binds, in order of preference: over tcp its port of the last run (kept in its
    file) and then any port, on the front's host; over ipc, a file of the run directory."""
    front = _TCP.match(front_endpoint)
    if front is None:
        return [endpoints.ipc(run_dir, f"{_PREFIX}{actor}.sock")]
    host = front["host"]
    last = _TCP.match(_read(endpoint_file(run_dir, actor)))
    kept = [f"tcp://{host}:{last['port']}"] if last is not None else []
    return [*kept, f"tcp://{host}:*"]


def bind(sock: zmq.Socket[bytes], front_endpoint: str, run_dir: Path, actor: str,
         reserved_ports: frozenset[int] = frozenset()) -> str:
    """Bind ``sock`` where ``bind_addresses`` says and publish the endpoint it got. A port of
    ``reserved_ports`` (the engine's own listening ports, which the actors that bind them may
    not have bound yet) is given back and another taken."""
    *kept, anywhere = bind_addresses(front_endpoint, run_dir, actor)
    endpoint = ""
    for address in kept:
        try:
            sock.bind(address)
            endpoint = _last_endpoint(sock)
            break
        except zmq.ZMQError as exc:  # taken by another process since: any port
            log.info("cannot bind %s again (%s): taking another port", address, exc)
    for _ in range(_RESERVED_RETRIES_MAX):
        if endpoint and _port(endpoint) not in reserved_ports:
            break
        if endpoint:
            sock.unbind(endpoint)
        sock.bind(anywhere)
        endpoint = _last_endpoint(sock)
    publish(run_dir, actor, endpoint)
    return endpoint


def publish(run_dir: Path, actor: str, endpoint: str) -> None:
    """Where ``actor`` listens, for the front's ``route`` answer (``advertised``), written whole."""
    path = endpoint_file(run_dir, actor)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(endpoint)
    temporary.replace(path)


def ports_of(*addresses: str) -> frozenset[int]:
    """The ports of ``addresses`` (``tcp://host:port`` or ``host:port``; "" and ipc have none)."""
    ports = set()
    for address in addresses:
        _, _, port = address.rpartition(":")
        if port.isdigit():
            ports.add(int(port))
    return frozenset(ports)


def _last_endpoint(sock: zmq.Socket[bytes]) -> str:
    bound = sock.getsockopt(zmq.LAST_ENDPOINT)
    assert isinstance(bound, bytes)
    return bound.decode()


def _port(endpoint: str) -> int:
    tcp = _TCP.match(endpoint)
    return int(tcp["port"]) if tcp is not None and tcp["port"] != "*" else -1


def advertised(front_endpoint: str, store_host: str, run_dir: Path, actors: list[str]) -> list[str]:
    """Where clients reach ``actors`` (those that answer directly and have bound): over tcp each
    one's port on the front's host, or on ``store_host`` when the front binds every address; the
    ipc files as they are."""
    front = _TCP.match(front_endpoint)
    host = front["host"] if front is not None else ""
    if host in _ANY_HOST:
        host = f"[{store_host}]" if ":" in store_host else store_host
    found = []
    for actor in actors:
        bound = _read(endpoint_file(run_dir, actor))
        tcp = _TCP.match(bound)
        if tcp is not None:
            found.append(f"tcp://{host}:{tcp['port']}")
        elif bound:
            found.append(bound)
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""
