"""A test bed of hosts: one network namespace per host, joined by veth pairs to a bridge.

    host "e0" (namespace)        hub (namespace)                   host "c0" (namespace)
   +----------------------+     +------------------------------+    +----------------------+
   | lo        127.0.0.1  |     |  br0 (bridge)                |    | lo        127.0.0.1  |
   | tb<id>0 198.18.0.10 ======== v0   v1  ...  vN  =============== tb<id>N 198.18.0.1N    |
   | nft: inet testbed    |     +------------------------------+    | nft: inet testbed    |
   | relay on :RELAY_PORT |                                          | relay on :RELAY_PORT |
   +----------------------+                                          +----------------------+

The addresses are RFC 2544's benchmarking range and exist only in the bed's namespaces: no
namespace has a default route and the root namespace has none of them, so nothing a test sends
to the bed leaves it, and nothing else is reached from it. Each host's nftables table ``testbed``
holds the faults: a cut (``partition``, ``cut``) drops what a host sends to and receives from the
other side; ``loss`` drops a share of what a host receives, at random; ``heal`` flushes them.
``relayed`` beds carry every TCP connection between hosts through the opener's delaying relay
(``relay.py``): ``delay`` sets a link's latency and jitter, for connections already open too.
``clocks`` beds run what they start under each host's own wall clock (``clock.py``):
``jump_clock`` moves one, ``heal`` puts them all back.

The test process is in none of the hosts: it runs a command on one (``popen``, ``prefix``),
makes a ZeroMQ context whose connections leave from one (``context``), or calls a function on a
thread inside one (``call``). ``close`` stops everything the bed started and deletes its
namespaces, also after a failure; a bed whose process died is swept by the next one.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path
from typing import TypeVar

import zmq

from harness.testbed import netns
from harness.testbed.clock import HostClocks
from harness.testbed.relay import RELAY_MARK, Delay, Delays, DelayTable

NETWORK = IPv4Network("198.18.0.0/24")  # RFC 2544: for benchmarks, on no real network
FIRST_HOST = 10  # host k is 198.18.0.(10 + k)
RELAY_PORT = 7999
RELAY_READY_S = 20.0

T = TypeVar("T")


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    address: str
    link: str  # its end of the veth pair (the hub's end: v<index>)


class TestBed:
    __test__ = False  # not a pytest class

    def __init__(self, root: Path, hosts: Sequence[str], *, relayed: bool = False, clocks: bool = False) -> None:
        assert len(set(hosts)) == len(hosts) and len(hosts) <= NETWORK.num_addresses - FIRST_HOST - 1, hosts
        self.root = root
        self.relayed = relayed
        self.hub = netns.owned_name("hub")
        self.hosts = {name: Host(name, netns.owned_name(name), str(NETWORK[FIRST_HOST + k]),
                                 f"tb{os.getpid() % 100_000}x{k}")
                      for k, name in enumerate(hosts)}
        self.relays: dict[str, subprocess.Popen[bytes]] = {}
        self.tables: dict[str, dict[str, Delay]] = {name: {} for name in hosts}
        self.base: tuple[float, float] | None = None  # every link's delay when no fault holds one (``base_delay``)
        self.contexts: list[zmq.Context[zmq.Socket[bytes]]] = []
        self.made: list[str] = []
        self.clocks = HostClocks(root, list(hosts)) if clocks else None

    def __enter__(self) -> TestBed:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        netns.sweep_stale()
        self.root.mkdir(parents=True, exist_ok=True)
        if self.clocks is not None:
            self.clocks.start()
        netns.create(self.hub)
        self.made.append(self.hub)
        netns.ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        netns.ip("-n", self.hub, "link", "set", "br0", "up")
        for k, host in enumerate(self.hosts.values()):
            netns.create(host.namespace)
            self.made.append(host.namespace)
            hub_end = f"v{k}"
            netns.ip("link", "add", host.link, "netns", host.namespace, "type", "veth",
                     "peer", "name", hub_end, "netns", self.hub)
            netns.ip("-n", host.namespace, "addr", "add", f"{host.address}/{NETWORK.prefixlen}", "dev", host.link)
            netns.ip("-n", host.namespace, "link", "set", host.link, "up")
            netns.ip("-n", self.hub, "link", "set", hub_end, "master", "br0")
            netns.ip("-n", self.hub, "link", "set", hub_end, "up")
            netns.nft_in(host.namespace, _base_rules(host, relayed=self.relayed))
        if self.relayed:
            for host in self.hosts.values():
                self._start_relay(host)

    def close(self) -> None:
        for context in self.contexts:
            context.destroy(linger=0)
        self.contexts.clear()
        for relay in self.relays.values():
            relay.kill()
            relay.wait()
            if relay.stdout is not None:
                relay.stdout.close()
        self.relays.clear()
        failures = []
        for namespace in reversed(self.made):  # the hosts, then the hub (the veth pairs go with them)
            try:
                netns.delete(namespace)
            except netns.NetnsError as exc:
                failures.append(str(exc))
        self.made.clear()
        if failures:
            raise netns.NetnsError("; ".join(failures))

    # -- running things on a host

    def address(self, name: str) -> str:
        return self.hosts[name].address

    def prefix(self, name: str) -> list[str]:
        """The words before a command that run it on host ``name``."""
        return netns.exec_prefix(self.hosts[name].namespace)

    def popen(self, name: str, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*self.prefix(name), *argv], **kwargs)  # type: ignore[call-overload]

    def call(self, name: str, fn: Callable[[], T]) -> T:
        """``fn()`` on a thread inside host ``name``: its sockets are that host's."""
        return netns.run_in(self.hosts[name].namespace, fn)

    def context(self, name: str) -> zmq.Context[zmq.Socket[bytes]]:
        """A ZeroMQ context whose connections leave from host ``name`` (its I/O threads started
        inside; closed by ``close``)."""
        def made() -> zmq.Context[zmq.Socket[bytes]]:
            context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
            context.socket(zmq.PAIR).close(linger=0)  # the first socket starts the I/O threads, here
            return context

        context = self.call(name, made)
        self.contexts.append(context)
        return context

    # -- faults

    def cut(self, side: Iterable[str], other: Iterable[str]) -> None:
        """Nothing passes between a host of ``side`` and a host of ``other``, either way."""
        side, other = list(side), list(other)
        for ours, theirs in ((side, other), (other, side)):
            addresses = ", ".join(self.address(name) for name in theirs)
            for name in ours:
                netns.nft_in(self.hosts[name].namespace,
                             f"add rule inet testbed faults_in ip saddr {{ {addresses} }} drop\n"
                             f"add rule inet testbed faults_out ip daddr {{ {addresses} }} drop\n")

    def partition(self, *groups: Iterable[str]) -> None:
        """Each group cut from every other; hosts in no group stay reachable from all."""
        listed = [list(group) for group in groups]
        for k, group in enumerate(listed):
            for other in listed[k + 1:]:
                self.cut(group, other)

    def loss(self, name: str, percent: int) -> None:
        """Host ``name`` drops ``percent`` % of the packets it receives from the bed, at random."""
        assert 0 < percent <= 100, percent
        drawn = f"numgen random mod 100 < {percent} " if percent < 100 else ""
        netns.nft_in(self.hosts[name].namespace, f"add rule inet testbed faults_in {drawn}drop\n")

    def delay(self, a: str, b: str, one_way_ms: float, jitter_ms: float = 0.0) -> None:
        """The link between ``a`` and ``b`` holds each chunk ``one_way_ms`` (plus up to ``jitter_ms``)
        each way: a round trip of twice that, whichever end opened the connection."""
        assert self.relayed, "delays need a relayed test bed"
        self.tables[a][self.address(b)] = Delay(one_way_ms, one_way_ms, jitter_ms)
        self.tables[b][self.address(a)] = Delay(one_way_ms, one_way_ms, jitter_ms)
        self._send_tables([a, b])

    def delay_all(self, one_way_ms: float, jitter_ms: float = 0.0) -> None:
        """Every link of the bed as ``delay`` sets one."""
        for a in self.hosts:
            self.tables[a] = {self.address(b): Delay(one_way_ms, one_way_ms, jitter_ms) for b in self.hosts if b != a}
        self._send_tables(list(self.hosts))

    def environment(self, name: str) -> dict[str, str]:
        """What a process started on host ``name`` runs with (its wall clock, on a ``clocks`` bed)."""
        return self.clocks.environment(name) if self.clocks is not None else {}

    def jump_clock(self, name: str, offset_s: int) -> None:
        """Host ``name``'s wall clock ``offset_s`` seconds off the real one, in the processes started
        with ``environment(name)``, within ``clock.JUMP_SETTLE_S``."""
        assert self.clocks is not None, "a bed made without clocks"
        self.clocks.set(name, offset_s)

    def base_delay(self, one_way_ms: float, jitter_ms: float = 0.0) -> None:
        """Every link's delay from now on, as ``delay_all`` sets it, and again after each heal: the
        network the bed stands for, under its faults."""
        self.base = (one_way_ms, jitter_ms)
        self.delay_all(one_way_ms, jitter_ms)

    def heal(self) -> None:
        """Every cut and loss gone, every delay back to the base delay (none, unless ``base_delay``),
        every wall clock back to the real one."""
        if self.clocks is not None:
            self.clocks.reset()
        for host in self.hosts.values():
            netns.nft_in(host.namespace, "flush chain inet testbed faults_in\nflush chain inet testbed faults_out\n")
        if self.base is not None:
            self.delay_all(*self.base)
        elif self.relayed:
            self.tables = {name: {} for name in self.hosts}
            self._send_tables(list(self.hosts))

    def _send_tables(self, names: list[str]) -> None:
        for name in names:
            Delays(self._control(name)).set(DelayTable(dict(self.tables[name])))

    def _control(self, name: str) -> str:
        return f"ipc://{self.root / f'relay-{name}.sock'}"

    def _start_relay(self, host: Host) -> None:
        """The host's relay, once it listens: its one line on stdout says so (then the pipe is
        closed: it writes nothing more there); its errors go to ``relay-<host>.log``."""
        with open(self.root / f"relay-{host.name}.log", "ab") as log:
            relay = self.popen(host.name, [sys.executable, "-m", "harness.testbed.relay",
                                           "--listen", f"{host.address}:{RELAY_PORT}",
                                           "--control", self._control(host.name)],
                               stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                               cwd=str(Path(__file__).resolve().parents[2]))
        self.relays[host.name] = relay
        assert relay.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(relay.stdout, selectors.EVENT_READ)
            ready = bool(selector.select(RELAY_READY_S)) and relay.stdout.readline().startswith(b"relay ready")
        relay.stdout.close()
        relay.stdout = None
        if not ready:
            raise netns.NetnsError(f"the relay of {host.name} did not start (see {self.root}/relay-{host.name}.log)")


def _base_rules(host: Host, *, relayed: bool) -> str:
    """The host's nftables table: loopback always passes, then the fault chains (empty: nothing
    dropped). A relayed host turns its connections to other hosts to its relay, but the relay's own.
    Its faults come first (priority -150, before the NAT's -100): a connection to a host cut off is
    dropped as sent, to the address it was sent to, not accepted by the relay and then closed."""
    rules = """
table inet testbed {
  chain faults_in { }
  chain faults_out { }
  chain input { type filter hook input priority 0; policy accept; iif "lo" accept; jump faults_in; }
  chain output { type filter hook output priority -150; policy accept; oif "lo" accept; jump faults_out; }
}
"""
    if relayed:
        rules += f"""
table ip testbed_relay {{
  chain output {{
    type nat hook output priority -100; policy accept;
    meta mark {RELAY_MARK:#x} return
    ip daddr {NETWORK} ip daddr != {host.address} meta l4proto tcp dnat to {host.address}:{RELAY_PORT}
  }}
}}
"""
    return rules
