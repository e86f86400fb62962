"""The test bed's latency: a delaying TCP relay on each host (this kernel has no netem).

Every TCP connection a host opens to another host of the bed is turned (nftables DNAT, in the
host's namespace) to the relay listening on the host's own address; the relay reads where it was
going (SO_ORIGINAL_DST), connects there itself (its socket marked ``RELAY_MARK``, which the DNAT
rule passes over) and copies both ways, each chunk held until its due time:

    app --(DNAT)--> relay on A  --[held out_ms]-->  B:port
    app <---------- relay on A  <--[held back_ms]-- B:port

    due = max(due of the chunk before, arrival + delay + uniform(0, jitter))   (TCP keeps order)

A connection is relayed once, on the host that opened it, so the round trip A<->B is
``out_ms + back_ms`` of A's table. The delays change on command (``Delays`` over ZeroMQ on an ipc
path: file paths cross namespaces) for connections already open too; an empty table relays at once.

Run: ``ip netns exec NS python -m harness.testbed.relay --listen ADDR:PORT --control ipc://PATH``;
it prints ``relay ready`` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import struct
import sys
import threading

import msgspec
import zmq

RELAY_MARK = 0x7262  # SO_MARK of the relay's own connections ("rb"): the DNAT rule lets them pass
SO_ORIGINAL_DST = 80  # <linux/netfilter_ipv4.h>
CHUNK_BYTES = 65536
HELD_CHUNKS_MAX = 1024  # per direction: a reader waits past this many held chunks (back-pressure)
CONTROL_TIMEOUT_MS = 5_000


class Delay(msgspec.Struct, frozen=True, array_like=True):
    out_ms: float  # this host -> the peer
    back_ms: float  # the peer -> this host
    jitter_ms: float = 0.0


class DelayTable(msgspec.Struct, frozen=True):
    """Peer address -> its delay; a peer not named: none."""
    delays: dict[str, Delay] = {}


class Delays:
    """The relay of one host, commanded from the test process."""

    def __init__(self, control: str, context: zmq.Context[zmq.Socket[bytes]] | None = None) -> None:
        self.control = control
        self.context = context or zmq.Context.instance()

    def set(self, table: DelayTable) -> None:
        """Replace the relay's table; returns once the relay holds it."""
        with self.context.socket(zmq.REQ) as sock:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVTIMEO, CONTROL_TIMEOUT_MS)
            sock.setsockopt(zmq.SNDTIMEO, CONTROL_TIMEOUT_MS)
            sock.connect(self.control)
            sock.send(msgspec.json.encode(table))
            reply = sock.recv()
        if reply != b"ok":
            raise RuntimeError(f"relay at {self.control} refused the table: {reply!r}")


class Relay:
    def __init__(self, seed: int) -> None:
        self.table = DelayTable()
        self.rng = random.Random(seed)

    def delay_s(self, peer: str, outward: bool) -> float:
        delay = self.table.delays.get(peer)
        if delay is None:
            return 0.0
        ms = delay.out_ms if outward else delay.back_ms
        return (ms + self.rng.uniform(0.0, delay.jitter_ms)) / 1000.0 if delay.jitter_ms else ms / 1000.0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        port, packed = struct.unpack("!2xH4s8x", sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16))
        peer = socket.inet_ntoa(packed)
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, RELAY_MARK)
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(upstream, (peer, port))
        except OSError:
            upstream.close()
            writer.close()  # the opener sees its connection end, as it would have been refused
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        up_reader, up_writer = await asyncio.open_connection(sock=upstream)
        try:
            await asyncio.gather(self.pump(reader, up_writer, peer, outward=True),
                                 self.pump(up_reader, writer, peer, outward=False))
        finally:
            writer.close()
            up_writer.close()

    async def pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str, *,
                   outward: bool) -> None:
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(HELD_CHUNKS_MAX)
        loop = asyncio.get_running_loop()

        async def release() -> None:
            while True:
                due, data = await held.get()
                if not data:
                    break
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(release())
        last_due = 0.0
        try:
            while not sender.done() and (data := await reader.read(CHUNK_BYTES)):
                last_due = max(last_due, loop.time() + self.delay_s(peer, outward))
                await held.put((last_due, data))
        except OSError:
            pass
        if not sender.done():
            await held.put((last_due, b""))  # the end, after what was held
        try:
            await sender
            if writer.can_write_eof():
                writer.write_eof()
        except OSError:
            writer.close()


def serve_control(relay: Relay, control: str) -> None:
    """A thread: each request replaces the table (a whole ``DelayTable``), answered ``ok``."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.REP)
    with sock:
        sock.bind(control)
        while True:
            raw = sock.recv()
            try:
                relay.table = msgspec.json.decode(raw, type=DelayTable)
                sock.send(b"ok")
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                sock.send(f"bad table: {exc}".encode())


async def main_async(listen: str, control: str, seed: int) -> None:
    relay = Relay(seed)
    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(relay.serve, host, int(port), reuse_address=True)
    threading.Thread(target=serve_control, args=(relay, control), daemon=True).start()
    print("relay ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.testbed.relay", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", required=True, help="ADDR:PORT, the host's own address")
    parser.add_argument("--control", required=True, help="the ZeroMQ endpoint of its delay table (ipc://PATH)")
    parser.add_argument("--seed", type=int, default=0, help="the jitter's random numbers")
    args = parser.parse_args(argv)
    try:
        asyncio.run(main_async(args.listen, args.control, args.seed))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
