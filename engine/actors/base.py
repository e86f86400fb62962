"""The runtime every actor process runs: its sockets, slots, clock, threads, loop and stop.

An actor's logic is a plain object (``Actor``): it declares the ports it talks
on (each one end of a channel of ``engine/ipc/channels.py``) and a handler for
each type of message it takes, and its handlers turn each message into effects
(``engine/actors/effects.py``).
Everything else is here, in one place:

* the sockets behind the ports (created after ``recover``, so nothing is served before);
* the shared offsets (``Env.slots``), the clock (``Env.clock``) and the background
  flush threads (``Env.syncer``), which the simulation replaces with its own;
* the loop: it polls the sockets, decodes every message against its channel
  (``engine/ipc/wire.py``), hands it to the handler of its type and carries out the
  effects, runs ``tick`` every ``tick_interval_ms`` and sends a heartbeat to the
  supervisor every ``heartbeat_interval_ms``; every turn does bounded work (at most 256
  messages a socket, one slice of a backlog), so no flood keeps an actor from its heartbeat;
* the stop: SIGTERM (also sent by the kernel when the supervisor dies, through
  PR_SET_PDEATHSIG) ends the loop, before it takes another message; the channels named in
  ``drain_at_stop`` are emptied (a request on them is answered SERVICE_NOT_AVAILABLE,
  ``Actor.refuse_at_stop``, and a publication handled), then ``shutdown`` leaves files consistent.

Lifecycle: INIT -> RECOVERING -> RUNNING -> STOPPING -> STOPPED, each step checked against the
table in ``engine/ipc/lifecycle.py`` (a step it does not allow is asserted).
An unexpected exception ends the process with a traceback: the supervisor restarts
the actor and its ``recover`` repairs what was left half done.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import functools
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from engine.actors.effects import Effects, Exit, Publish, Reply, Tell
from engine.actors.file_syncer import FileSyncer
from engine.config import StoreConfig, decode_config
from engine.ipc import channels, direct_replies, endpoints, protocol, wire
from engine.ipc.channels import PUBLISH, REQUEST, Channel
from engine.ipc.lifecycle import Lifecycle, actor_step
from engine.ipc.messages import Heartbeat, encoder
from engine.logs import LOG_DIR, configure_logging
from engine.metrics.report import Figures, Reporter
from engine.store.shared_offsets import SharedOffsets
from engine.store.sync import SyncerFactory

if TYPE_CHECKING:
    from engine.ipc.curve import CurveServer, ReplicationKeys

if not __debug__:
    raise SystemExit("the engine's actors rely on assertions; do not run them with python -O")

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_POLL_SLICE_MS = 50
_DRAIN_MESSAGES_MAX = 256
# At a stop, a ``drain_at_stop`` channel is read until nothing came for _STOP_QUIET_MS (a request
# ZeroMQ's I/O thread is still taking in), for at most _STOP_DRAIN_MS_MAX: peers that keep sending
# (the timer and the transaction actor ask the front again at every tick once refused; clients
# retry) would otherwise hold every stop for the whole bound (the front's took 0.7 s with 500).
_STOP_QUIET_MS = 20
_STOP_DRAIN_MS_MAX = 60
_EXIT_LINGER_MS = 1000
_DIRECT_MESSAGE_BYTES_MAX = 1_024  # what a client may send on a direct-replies ROUTER before it is cut off
PEER_WAIT_MS_MAX = 2_000  # then RUNNING anyway: a peer that is down is the supervisor's to restart

# pyzmq's send_multipart and recv_multipart cost about 6 us a message more than the same calls
# on its Cython socket with int flags (its sugar combines enum flags in Python, per frame).
_SNDMORE, _RCVMORE, _NOBLOCK = int(zmq.SNDMORE), int(zmq.RCVMORE), int(zmq.NOBLOCK)
_COPY_BYTES_MAX = 65_536  # larger frames go zero-copy, as pyzmq's own send does past its threshold
_raw_send = zmq.backend.Socket.send
_raw_recv = zmq.backend.Socket.recv


def send_frames(sock: zmq.Socket[bytes], frames: list[bytes], flags: int = 0) -> None:
    """``send_multipart``, faster; with NOBLOCK, zmq.Again means nothing was queued (the
    first frame is refused, or all of them are taken)."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        more = flags | _SNDMORE if i < last else flags
        if len(frame) <= _COPY_BYTES_MAX:
            _raw_send(sock, frame, more)
        else:
            _raw_send(sock, frame, more, copy=False)


def recv_frames(sock: zmq.Socket[bytes], flags: int = 0) -> list[bytes]:
    """``recv_multipart``, faster: every frame as bytes."""
    frames = [_raw_recv(sock, flags)]
    while sock.get(_RCVMORE):
        frames.append(_raw_recv(sock))
    return frames


@functools.lru_cache(maxsize=1024)
def peer_ip(address: str) -> bytes:
    """ZeroMQ's "Peer-Address" of a TCP peer as RocketMQ stores a host: 4 bytes of IPv4 or 16 of
    IPv6 (an IPv4-mapped IPv6 address, from a dual-stack bind, is IPv4, as Java's InetAddress
    makes it; a link-local one loses its zone); b"" for what is no IP address (an ipc:// peer)."""
    address = address.partition("%")[0]
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            ip = socket.inet_pton(family, address)
        except OSError:
            continue
        return ip[12:] if ip[:12] == b"\0" * 10 + b"\xff\xff" else ip
    return b""


def recv_frames_from(sock: zmq.Socket[bytes], flags: int = 0, *,
                     with_key: bool = False) -> tuple[list[bytes], bytes, str]:
    """``recv_frames`` for a ROUTER, with the sender's IP (``peer_ip``) and, ``with_key`` (a CURVE
    port), the public key its handshake proved (ZAP's User-Id: Z85; "" if none).

    ZeroMQ gives a message's peer address only on a zero-copy frame (``Frame.get``): the frame
    after the routing id is taken so, about 2 us more than as bytes, once a message. The address
    is not kept by routing id: a peer may choose its id and reconnect from elsewhere under it."""
    frames = [_raw_recv(sock, flags)]
    ip = b""
    key = ""
    if sock.get(_RCVMORE):
        frame = _raw_recv(sock, 0, copy=False)
        try:
            ip = peer_ip(frame.get("Peer-Address"))
        except zmq.ZMQError:  # a transport without addresses
            pass
        if with_key:
            try:
                key = str(frame.get("User-Id"))
            except zmq.ZMQError:  # no ZAP handshake on this connection
                pass
        frames.append(frame.bytes)
        while sock.get(_RCVMORE):
            frames.append(_raw_recv(sock))
    return frames, ip, key


# Port kinds (ZeroMQ socket types).
ROUTER, DEALER, PUB, SUB = "ROUTER", "DEALER", "PUB", "SUB"
_ZMQ_KINDS = {ROUTER: zmq.ROUTER, DEALER: zmq.DEALER, PUB: zmq.PUB, SUB: zmq.SUB}


class Clock:
    """The host's clocks, in ms: monotonic for deadlines and waits, wall for store times."""

    def mono_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


class Waker:
    """How a thread of an actor wakes the actor's loop, which then calls ``Actor.on_thread_wake``: the
    runtime polls an eventfd beside the sockets (``fd``); the simulation calls the actor at a
    step of its choosing. Safe to call from any thread."""

    def __init__(self) -> None:
        self.fd = -1  # set by the runtime

    def wake(self) -> None:
        if self.fd >= 0:
            os.eventfd_write(self.fd, 1)


@dataclass(frozen=True)
class Coordination:
    """What the simulation gives the broker membership actor in place of etcd's gateway: a client of
    its model of etcd."""

    etcd: Callable[[StoreConfig], Any]


@dataclass(frozen=True)
class Env:
    """What an actor is given: who it is, its store and settings, and the runtime's services."""

    name: str
    instance: int
    store_dir: Path
    run_dir: Path
    config: StoreConfig
    slots: SharedOffsets
    clock: Clock = field(default_factory=Clock)
    syncer: SyncerFactory = FileSyncer
    waker: Waker = field(default_factory=Waker)
    background: bool = True  # may the store objects prepare files in background threads
    process_id: int = field(default_factory=os.getpid)  # in message ids (the simulation gives its own)
    coordination: Coordination | None = None  # the simulation's etcd and supervisor (``Coordination``)


@dataclass(frozen=True)
class Port:
    """One socket an actor talks on: its end of ``channel``, the binding one or a connecting one.
    ``address`` replaces the channel's endpoint (the client endpoint of the settings);
    ``subscribe`` the topics of a SUB."""

    channel: Channel
    bind: bool
    address: str = ""
    subscribe: tuple[bytes, ...] = ()
    hwm: int | None = None
    max_message_bytes: int = -1
    immediate: bool = False  # DEALER: queue nothing for a peer that is not connected
    reconnect_ivl_ms: int | None = None
    monitor: bool = False  # report connects and disconnects (``Actor.connection``)
    # DEALER to an actor of an earlier wave: RUNNING only once connected to it (``PEER_WAIT_MS_MAX``),
    # so a request just after the engine is ready is not refused for a connection still being made
    await_peer: bool = False
    curve: bool = False  # CURVE with the allow-list of the config (the client endpoint)
    set_key: bool = False  # CURVE with the broker set's key (the replication channel, if configured)
    peer_address: bool = False  # ROUTER: each message with its sender's IP (``Inbound.peer_ip``; and key, CURVE)
    # ROUTER: a peer whose connection breaks is named to the actor (``Actor.peer_lost``), as
    # ZMQ_ROUTER_NOTIFY would (a draft option this libzmq lacks): each peer's connection is known by
    # the descriptor its last message came on (ZMQ_SRCFD), and the monitor names the one that closed
    peers_monitored: bool = False
    # ZMTP heartbeats (ZMQ_HEARTBEAT_IVL, a quarter of it, and ZMQ_HEARTBEAT_TIMEOUT): a connection
    # that carries nothing for this long, not even a ping's answer, is closed (0: none)
    heartbeat_timeout_ms: int = 0

    def __post_init__(self) -> None:
        assert self.address or not self.channel.endpoint.startswith("<config."), self.channel.name

    @property
    def name(self) -> str:
        return self.channel.name

    @property
    def kind(self) -> str:
        if self.channel.pattern == REQUEST:
            return ROUTER if self.bind else DEALER
        assert self.channel.pattern == PUBLISH
        return PUB if self.bind else SUB

    @property
    def endpoint(self) -> str:
        """An internal name (an ipc file in the run directory) or a full address."""
        return self.address or self.channel.endpoint


# (the typed message, the whole inbound, effects). Any: a handler takes the type it is registered
# under in ``Actor.handlers``, which a dict's value type cannot say (the runtime checks the pairing).
Handler = Callable[[Any, wire.Inbound, Effects], None]


class Actor:
    """An actor's logic. Subclasses declare ``ports`` and ``handlers`` and override the hooks they need."""

    tick_interval_ms = 100
    # Channels whose queued messages are taken before ``shutdown``: a publication is handled, a request
    # refused (``refuse_at_stop``), so that no client waits out its deadline for an actor that is gone.
    drain_at_stop: tuple[Channel, ...] = ()
    # Its answers to the front's clients may go to them directly (``engine/ipc/direct_replies.py``).
    answers_directly = False

    def __init__(self, env: Env) -> None:
        self.env = env
        self.config = env.config
        self.slots = env.slots
        self.clock = env.clock
        self.lifecycle = Lifecycle.INIT

    def ports(self) -> list[Port]:
        """The sockets to open once ``recover`` is done."""
        return []

    def direct_channel(self) -> Channel | None:
        """The channel of its answers straight to clients (``channels.replies``), when it opens one."""
        return channels.replies(self.env.name) if self.answers_directly and self.config.direct_replies_enabled else None

    def takes_direct_requests(self) -> bool:
        """Whether clients send requests on its direct channel too (the writer: sends), each handed to
        its ``ClientFrame`` handler; otherwise what a client sends there is dropped."""
        return False

    def handlers(self) -> dict[type, Handler]:
        """The handler of each type of message the actor takes (orders of ``Routed`` requests,
        ``Answered``, publications, ``ClientFrame``): a message of another type is a bug of the
        sender, asserted."""
        return {}

    def recover(self, out: Effects) -> None:
        """Repair and load state; runs before any port is open (its effects are carried out after)."""

    @functools.cached_property
    def handler_table(self) -> dict[type, Handler]:
        """``handlers()``, asked once."""
        return self.handlers()

    def take(self, port: Port, frames: list[bytes], out: Effects, peer_ip: bytes = b"", peer_key: str = "") -> None:
        """One message from ``port``: decoded against its channel and handed to the handler of its type.
        Frames that break the client protocol's layout are dropped (nothing sensible can be answered)."""
        try:
            inbound = wire.decode(port.channel, port.bind, frames, peer_ip, peer_key)
        except wire.WireError:
            return
        if inbound.origin is not None and self.lifecycle is Lifecycle.STOPPING:
            self.refuse_at_stop(inbound, out)
            return
        handler = self.handler_table.get(type(inbound.body))
        assert handler is not None, f"{self.env.name} has no handler for {type(inbound.body).__name__}"
        handler(inbound.body, inbound, out)

    def refuse_at_stop(self, inbound: wire.Inbound, out: Effects) -> None:
        """A request still queued when the actor stopped (``drain_at_stop``): nothing of it is done,
        and its client hears so at once, SERVICE_NOT_AVAILABLE, instead of waiting out its deadline.
        An actor whose requester expects a note beside the answer overrides this."""
        assert inbound.origin is not None
        out.reply(inbound.origin, protocol.encode_stopping(inbound.payload))

    def drained(self, channel: Channel, out: Effects) -> None:
        """Every message queued on ``channel`` for this turn was handled (group commits go here)."""

    def connection(self, channel: Channel, up: bool) -> None:
        """A monitored port connected to (or lost) its peer."""

    def peer_lost(self, channel: Channel, peer: bytes, out: Effects) -> None:
        """The connection of ``peer`` (its routing id) to a ``peers_monitored`` port broke."""

    def on_thread_wake(self, out: Effects) -> None:
        """One of the actor's own threads called ``env.waker.wake()`` (one call for any number of wakes)."""

    def tick(self, out: Effects) -> None:
        """Periodic work; runs every ``tick_interval_ms``."""

    def detail(self) -> dict[str, int]:
        """Figures for the heartbeat (offsets, counts)."""
        return {}

    def condition(self) -> str:
        """Why this actor, though running, cannot do its work ("" when it can), in a few words that
        name the cause: "cannot append: disk full (need 4160 bytes, 0 free)". The supervisor reports
        the engine DEGRADED with it until it is "" again (``Heartbeat.condition``)."""
        return ""

    def metrics(self) -> Figures:
        """Figures for the monitor, by family of ``engine/metrics/families.py`` (``report.py``)."""
        return {}

    def backlog(self) -> bool:
        """True while work is left that a handler cut short to keep one loop turn bounded.

        The loop then polls without waiting and calls ``work_backlog`` once a turn, so a
        burst (thousands of woken long polls, a long catch-up) is served in slices with
        heartbeats between them."""
        return False

    def work_backlog(self, out: Effects) -> None:
        """Do one bounded slice of the backlog."""

    def shutdown(self, out: Effects) -> None:
        """Leave files consistent; runs once, after the loop ends."""


class Runtime:
    """Runs one actor in this process over ZeroMQ."""

    def __init__(self, actor: Actor, zmq_context: zmq.Context[zmq.Socket[bytes]]) -> None:
        self.actor = actor
        self.env = actor.env
        self.zctx = zmq_context
        self.sockets: dict[Channel, zmq.Socket[bytes]] = {}
        # what to do when a socket (or the waker's eventfd) is readable
        self.readers: dict[zmq.Socket[bytes] | int, Callable[[], None]] = {}
        self.curve: CurveServer | None = None  # the front's, with CURVE on
        self.set_key: ReplicationKeys | None = None  # the replication actors', with replication_curve_secret_key_file
        self.stopping = False
        self.monitors: list[zmq.Socket[bytes]] = []  # the sockets reporting the ports' connections
        self.unconnected: set[Channel] = set()  # ports with ``await_peer`` not yet connected
        self.direct: zmq.Socket[bytes] | None = None  # the ROUTER of answers straight to clients
        self.peer_fds: dict[Channel, dict[bytes, int]] = {}  # ``peers_monitored``: routing id -> descriptor

    def open(self, port: Port) -> None:
        assert port.channel.opened_by(self.env.name, bind=port.bind), f"{self.env.name} may not open {port.name}"
        cfg = self.env.config
        sock = endpoints.configure(self.zctx.socket(_ZMQ_KINDS[port.kind]), hwm=port.hwm or cfg.socket_hwm_messages,
                                   max_message_bytes=port.max_message_bytes)
        for topic in port.subscribe:
            sock.setsockopt(zmq.SUBSCRIBE, topic)
        if port.immediate:
            sock.setsockopt(zmq.IMMEDIATE, 1)
        if port.reconnect_ivl_ms is not None:
            sock.setsockopt(zmq.RECONNECT_IVL, port.reconnect_ivl_ms)
        if port.curve:  # encryption, and only the clients of the allow-list get in
            self.secure(sock)
        if port.set_key and cfg.replication_curve_secret_key_file:  # encryption, and only the set's members
            if self.set_key is None:
                from engine.ipc.curve import ReplicationKeys

                self.set_key = ReplicationKeys(self.zctx, cfg.replication_curve_secret_key_file,
                                               cfg.replication_curve_authorized_keys_dir, cfg.replica_of_broker_id)
            (self.set_key.serve if port.bind else self.set_key.join)(sock)
        if port.heartbeat_timeout_ms:
            sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, port.heartbeat_timeout_ms // 4))
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, port.heartbeat_timeout_ms)
        events = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED if port.monitor or port.peers_monitored else 0) \
            | (zmq.EVENT_HANDSHAKE_SUCCEEDED if port.await_peer else 0)
        if events:  # watch before connecting, so the first connection is not missed
            monitor = sock.get_monitor_socket(events)
            self.readers[monitor] = lambda: self.on_monitor(port, monitor)
            self.monitors.append(monitor)
        if port.await_peer:
            self.unconnected.add(port.channel)
        address = port.endpoint if "://" in port.endpoint else endpoints.ipc(self.env.run_dir, port.endpoint)
        endpoints.allow_ipv6(sock, address)
        if port.bind:
            sock.bind(address)
        else:
            sock.connect(address)
        self.sockets[port.channel] = sock
        if port.peers_monitored:
            self.peer_fds[port.channel] = {}
            self.readers[sock] = lambda: self.on_readable_noting_peers(port, sock)
        elif port.peer_address:
            self.readers[sock] = lambda: self.on_readable_from(port, sock)
        elif port.kind != PUB:
            self.readers[sock] = lambda: self.on_readable(port, sock)

    def secure(self, sock: zmq.Socket[bytes]) -> None:
        """CURVE on ``sock`` with the allow-list of the config: one authenticator for the actor."""
        if self.curve is None:
            from engine.ipc.curve import CurveServer  # zmq.auth costs every other actor 3 MiB

            cfg = self.env.config
            self.curve = CurveServer(self.zctx, cfg.curve_server_secret_key_file, cfg.curve_authorized_keys_dir)
        self.curve.secure(sock)

    def open_direct(self) -> None:
        """The ROUTER of ``channels.replies``: answers to clients connected to it go out on it."""
        channel = channels.replies(self.env.name)
        assert channel.opened_by(self.env.name, bind=True), f"{self.env.name} may not open {channel.name}"
        cfg = self.env.config
        takes = self.actor.takes_direct_requests()
        # Without requests taken here, a client sends nothing: one that sends more than a few bytes is cut off.
        sock = endpoints.configure(self.zctx.socket(zmq.ROUTER), hwm=cfg.socket_hwm_messages,
                                   max_message_bytes=cfg.client_frame_bytes_max if takes else _DIRECT_MESSAGE_BYTES_MAX)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a client not connected here: told at once, not dropped
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a client reconnecting under its id takes its id over
        if cfg.curve_enabled:
            self.secure(sock)
        endpoints.allow_ipv6(sock, cfg.endpoint)
        own = direct_replies.ports_of(cfg.endpoint, cfg.grpc_endpoint, cfg.metrics_endpoint, cfg.dashboard_endpoint,
                                      cfg.replication_endpoint)  # the engine's other listeners, maybe not bound yet
        endpoint = direct_replies.bind(sock, cfg.endpoint, self.env.run_dir, self.env.name, own)
        self.direct = sock
        if takes:  # each request with its sender's IP, the born host of what it sends
            port = Port(channel, bind=True, address=endpoint, peer_address=True)
            self.sockets[channel] = sock
            self.readers[sock] = lambda: self.on_readable_from(port, sock)
        else:
            self.readers[sock] = lambda: self.on_direct_readable(sock)

    def on_direct_readable(self, sock: zmq.Socket[bytes]) -> None:
        """A client sends nothing on the direct channel: what one sends is dropped."""
        for _ in range(_DRAIN_MESSAGES_MAX):
            try:
                recv_frames(sock, _NOBLOCK)
            except zmq.Again:
                return

    def answered_directly(self, reply: Reply) -> bool:
        """Whether ``reply``, a plain answer to a client of the front, went straight to its client."""
        frames = wire.direct_frames(*reply)
        if frames is None:
            return False
        assert self.direct is not None
        try:
            send_frames(self.direct, frames, _NOBLOCK)
        except zmq.ZMQError:  # not connected here (EHOSTUNREACH), or its queue is full (EAGAIN)
            return False
        return True

    def answer_on_direct(self, reply: Reply) -> None:
        """The answer to a request a client made on the direct channel: dropped when the client is
        gone (EHOSTUNREACH) or reads nothing (its queue full, EAGAIN), never waited for."""
        assert self.direct is not None
        try:
            send_frames(self.direct, wire.reply_frames(*reply), _NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("an answer to a client on the direct channel was dropped: %s", exc)

    def carry_out(self, out: Effects) -> None:
        for effect in out:
            if isinstance(effect, Reply):
                if self.direct is not None and self.answered_directly(effect):
                    continue
                if self.direct is not None and self.sockets.get(effect.origin.channel) is self.direct:
                    self.answer_on_direct(effect)
                    continue
                send_frames(self.sockets[effect.origin.channel], wire.reply_frames(*effect))
            elif isinstance(effect, Publish):
                send_frames(self.sockets[effect.channel], wire.publication_frames(*effect))
            elif isinstance(effect, Tell):
                try:
                    send_frames(self.sockets[effect.channel], wire.request_frames(*effect[:3]), _NOBLOCK)
                except zmq.Again:
                    refusal = effect.refused()
                    if refusal is not None:
                        send_frames(self.sockets[refusal.origin.channel], wire.reply_frames(*refusal))
            else:
                assert isinstance(effect, Exit)
                log.critical("exiting (%d): %s", effect.code, effect.reason)
                self.zctx.destroy(linger=_EXIT_LINGER_MS)  # let the sends before it reach their peers
                os._exit(effect.code)  # no clean shutdown: nothing more may be written by this process
        out.clear()

    def on_readable(self, port: Port, sock: zmq.Socket[bytes]) -> None:
        """Handle up to ``_DRAIN_MESSAGES_MAX`` queued messages without blocking, then ``drained``.

        Frames arrive as bytes: for the small frames that make up most traffic a copy is
        cheaper than pyzmq's zero-copy Frame objects (about 11 us against 15 us a message)."""
        actor, out = self.actor, Effects()
        for _ in range(_DRAIN_MESSAGES_MAX):
            try:
                frames = recv_frames(sock, _NOBLOCK)
            except zmq.Again:
                break
            actor.take(port, frames, out)
            if out:
                self.carry_out(out)
        actor.drained(port.channel, out)
        self.carry_out(out)

    def on_readable_from(self, port: Port, sock: zmq.Socket[bytes]) -> None:
        """``on_readable`` for a ``peer_address`` port: each message with its sender's IP (and on a
        CURVE port whose requests are checked, ``acl_enabled``, its key)."""
        actor, out, with_key = self.actor, Effects(), port.curve and self.env.config.acl_enabled
        for _ in range(_DRAIN_MESSAGES_MAX):
            try:
                frames, ip, key = recv_frames_from(sock, _NOBLOCK, with_key=with_key)
            except zmq.Again:
                break
            actor.take(port, frames, out, ip, key)
            if out:
                self.carry_out(out)
        actor.drained(port.channel, out)
        self.carry_out(out)

    def on_readable_noting_peers(self, port: Port, sock: zmq.Socket[bytes]) -> None:
        """``on_readable`` for a ``peers_monitored`` port: each peer's descriptor noted (ZMQ_SRCFD of
        the frame after its routing id), for ``on_monitor`` to name the peer whose connection closed.
        A descriptor closed is reused only after the monitor said so, and the monitor is read first."""
        actor, out, fds = self.actor, Effects(), self.peer_fds[port.channel]
        for _ in range(_DRAIN_MESSAGES_MAX):
            try:
                routing_id = _raw_recv(sock, _NOBLOCK)
            except zmq.Again:
                break
            frames = [routing_id]
            while sock.get(_RCVMORE):
                frame = _raw_recv(sock, 0, copy=False)
                if len(frames) == 1:
                    fds[routing_id] = frame.get(zmq.SRCFD)
                frames.append(frame.bytes)
            actor.take(port, frames, out)
            if out:
                self.carry_out(out)
        actor.drained(port.channel, out)
        self.carry_out(out)

    def drain(self, sock: zmq.Socket[bytes]) -> None:
        """At a stop: take what ``sock`` holds, and what still arrives until it stays quiet for
        ``_STOP_QUIET_MS`` (at most ``_STOP_DRAIN_MS_MAX`` in all)."""
        clock = self.env.clock
        deadline = clock.mono_ms() + _STOP_DRAIN_MS_MAX
        while clock.mono_ms() < deadline and sock.poll(_STOP_QUIET_MS, zmq.POLLIN):
            self.readers[sock]()

    def open_waker(self) -> None:
        """The eventfd behind ``env.waker``: a wake from the actor's threads makes it readable."""
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.env.waker.fd = fd
        self.readers[fd] = lambda: self.on_waker(fd)

    def on_waker(self, fd: int) -> None:
        try:
            os.eventfd_read(fd)  # the count back to 0: one call for every wake since the last
        except BlockingIOError:
            return
        out = Effects()
        self.actor.on_thread_wake(out)
        self.carry_out(out)

    def on_monitor(self, port: Port, monitor: zmq.Socket[bytes]) -> None:
        from zmq.utils.monitor import recv_monitor_message  # it loads asyncio: 3 MiB in every other actor

        for _ in range(64):
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:  # with IMMEDIATE, sends are taken from now on
                self.unconnected.discard(port.channel)
            elif port.peers_monitored and event["event"] == zmq.EVENT_DISCONNECTED:
                self.peers_lost(port, int(event["value"]))
            elif port.monitor and event["event"] in (zmq.EVENT_CONNECTED, zmq.EVENT_DISCONNECTED):
                self.actor.connection(port.channel, event["event"] == zmq.EVENT_CONNECTED)

    def peers_lost(self, port: Port, fd: int) -> None:
        """The connection on descriptor ``fd`` closed: the peers whose last message came on it are lost."""
        fds, out = self.peer_fds[port.channel], Effects()
        for peer in [peer for peer, peer_fd in fds.items() if peer_fd == fd]:
            del fds[peer]
            self.actor.peer_lost(port.channel, peer, out)
        self.carry_out(out)

    def await_peers(self, heartbeat: zmq.Socket[bytes]) -> None:
        """Until every ``await_peer`` port is connected, or ``PEER_WAIT_MS_MAX`` passed; only the
        monitors are read meanwhile (what else arrives waits in its socket)."""
        actor, clock, cfg = self.actor, self.env.clock, self.env.config
        deadline = clock.mono_ms() + PEER_WAIT_MS_MAX
        poller = zmq.Poller()
        for monitor in self.monitors:
            poller.register(monitor, zmq.POLLIN)
        next_beat = clock.mono_ms() + cfg.heartbeat_interval_ms
        while self.unconnected and (now := clock.mono_ms()) < deadline:
            if now >= next_beat:
                send_heartbeat(heartbeat, actor.env.name, actor.lifecycle, actor.detail(), actor.condition())
                next_beat = now + cfg.heartbeat_interval_ms
            for sock, _event in poller.poll(min(deadline, next_beat) - now):
                self.readers[sock]()
        if self.unconnected:
            log.warning("not connected to %s after %d ms; serving anyway", ", ".join(
                sorted(channel.name for channel in self.unconnected)), PEER_WAIT_MS_MAX)

    def report(self, reporter: Reporter) -> None:
        try:
            reporter.write(self.actor.metrics(), self.env.clock.wall_ms())
        except OSError as exc:  # the run directory is on a full or gone file system: metrics wait
            log.warning("cannot write the metrics report: %s", exc)

    def run(self, heartbeat: zmq.Socket[bytes], parent: int) -> None:
        actor, clock = self.actor, self.env.clock
        out = Effects()
        actor.lifecycle = actor_step(actor.lifecycle, Lifecycle.RECOVERING)
        send_heartbeat(heartbeat, actor.env.name, actor.lifecycle, actor.detail(), actor.condition())
        self.open_waker()  # before recovery, which may start the actor's threads
        actor.recover(out)
        ports = {port.channel: port for port in actor.ports()}
        for port in ports.values():
            self.open(port)
        if actor.direct_channel() is not None:
            self.open_direct()
        self.await_peers(heartbeat)
        self.carry_out(out)
        actor.lifecycle = actor_step(actor.lifecycle, Lifecycle.RUNNING)
        poller = zmq.Poller()
        for sock in self.readers:
            poller.register(sock, zmq.POLLIN)
        cfg = self.env.config
        reporter = Reporter(self.env.run_dir, actor.env.name) \
            if cfg.metrics_endpoint or cfg.dashboard_endpoint else None
        next_tick = next_beat = next_report = clock.mono_ms()
        while not self.stopping:
            now = clock.mono_ms()
            if now >= next_beat:
                send_heartbeat(heartbeat, actor.env.name, actor.lifecycle, actor.detail(), actor.condition())
                next_beat = now + cfg.heartbeat_interval_ms
                if os.getppid() != parent:
                    log.error("the supervisor is gone; stopping")
                    break
            if reporter is not None and now >= next_report:
                self.report(reporter)
                next_report = now + cfg.metrics_report_interval_ms
            if now >= next_tick:
                actor.tick(out)
                self.carry_out(out)
                if self.curve is not None and self.curve.reload_allow_list():
                    log.info("CURVE allow-list read from %s", self.env.config.curve_authorized_keys_dir)
                next_tick = now + actor.tick_interval_ms
            busy = actor.backlog()
            timeout = 0 if busy else max(0, min(next_tick, next_beat, now + _POLL_SLICE_MS) - clock.mono_ms())
            if not self.readers:  # an empty poll returns at once: wait here instead
                time.sleep(timeout / 1000)
            for sock, _event in poller.poll(timeout) if self.readers else ():
                if self.stopping:  # SIGTERM came during the poll: what is queued now is the stop's
                    break
                self.readers[sock]()
            if busy:
                actor.work_backlog(out)
                self.carry_out(out)
        actor.lifecycle = actor_step(actor.lifecycle, Lifecycle.STOPPING)
        send_heartbeat(heartbeat, actor.env.name, actor.lifecycle, actor.detail(), actor.condition())
        for channel in actor.drain_at_stop:
            self.drain(self.sockets[channel])
        direct = actor.direct_channel()
        if direct is not None and direct in self.sockets:  # requests made on it: refused as the others
            self.drain(self.sockets[direct])
        actor.shutdown(out)
        self.carry_out(out)
        if self.curve is not None:
            self.curve.stop()
        if self.set_key is not None:
            self.set_key.stop()
        actor.lifecycle = actor_step(actor.lifecycle, Lifecycle.STOPPED)
        send_heartbeat(heartbeat, actor.env.name, actor.lifecycle, actor.detail(), actor.condition())


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        log.warning("PR_SET_PDEATHSIG unavailable; relying on parent pid checks")


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="run one engine actor (started by the supervisor)")
    parser.add_argument("--name", required=True)
    parser.add_argument("--instance", type=int, default=0)
    parser.add_argument("--store-dir", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, required=True, help="JSON config written by the supervisor")
    parser.add_argument("--start-gate-fd", type=int, help="wait for a byte on this pipe before recovering")
    return parser.parse_args(argv)


def _await_start_gate(fd: int) -> None:
    """Wait until the supervisor lets this actor recover (its wave has come; ``Supervisor.start``
    spawns every actor at once, so that imports overlap with the earlier waves' recovery). The
    pipe closed without a byte: the start failed or was stopped first, exit without touching the store."""
    try:
        go = os.read(fd, 1)
    finally:
        os.close(fd)
    if not go:
        log.info("the engine stopped before this actor's wave started")
        raise SystemExit(0)


def process_setup(argv: list[str] | None) -> tuple[argparse.Namespace, int]:
    """What every actor process does first: its arguments, its log, and its ties to the
    supervisor. Returns the arguments and the supervisor's pid."""
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(args.name, args.store_dir / LOG_DIR, decode_config(args.config.read_bytes()))
    parent = os.getppid()
    _die_with_parent()
    # The supervisor sends SIGUSR1 before killing a hung actor: its stacks land in the actor's raw
    # stderr, logs/<name>.stderr (faulthandler writes to the descriptor, past logging).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the supervisor, which stops us in order
    if args.start_gate_fd is not None:
        _await_start_gate(args.start_gate_fd)
    return args, parent


def main(actor_cls: type[Actor], argv: list[str] | None = None) -> int:
    """Entry point of an actor process."""
    args, parent = process_setup(argv)
    zctx = zmq.Context()
    env = Env(args.name, args.instance, args.store_dir.resolve(), args.run_dir,
              decode_config(args.config.read_bytes()), SharedOffsets(args.run_dir))
    runtime = Runtime(actor_cls(env), zctx)
    signal.signal(signal.SIGTERM, lambda *_: setattr(runtime, "stopping", True))
    heartbeat = endpoints.configure(zctx.socket(zmq.PUSH), hwm=16)
    heartbeat.connect(endpoints.ipc(args.run_dir, channels.HEARTBEATS.endpoint))
    try:
        runtime.run(heartbeat, parent)
    finally:
        zctx.destroy(linger=0)  # closes every socket the actor opened
    return 0


def send_heartbeat(heartbeat: zmq.Socket[bytes], name: str, lifecycle: Lifecycle, detail: dict[str, int],
                   condition: str = "") -> None:
    beat = Heartbeat(name, os.getpid(), lifecycle, detail, condition)
    try:
        heartbeat.send(encoder.encode(beat), zmq.NOBLOCK)
    except zmq.Again:
        pass
