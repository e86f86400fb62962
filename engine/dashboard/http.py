"""A bounded HTTP server for the monitor's ports: a burst of connections costs it nothing it
cannot afford.

The standard library's ``ThreadingHTTPServer`` gives every connection a thread of its own,
with no limit and no timeout: a few hundred half-sent requests pin as many threads, and when
they all end at once the monitor runs as many scrapes together, the GIL goes round them all
and the monitor's own loop misses its heartbeat (the supervisor then kills it). Here:

* one thread (``serve``) accepts and reads every request head without blocking, up to
  ``http_connections_max`` connections a port. Past that, the oldest connection whose head
  is still incomplete is dropped for the new one (an idle or slow client loses its place,
  a scrape arriving whole does not), or, when every connection is being answered, the new
  one is told 503 and closed;
* a head must arrive whole within ``http_request_timeout_ms`` (and be at most
  ``HEAD_BYTES_MAX``), or the connection is closed;
* whole requests are answered by ``http_workers_max`` threads; the others wait their turn
  (each counts against ``http_connections_max`` until answered). Each send of an answer
  has the same timeout, so a client that reads nothing frees its worker.

Requests are GET only (the monitor serves nothing else), one a connection (HTTP/1.0: the
server closes after answering), so the head is the whole request.
"""

from __future__ import annotations

import io
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

log = logging.getLogger(__name__)
HEAD_BYTES_MAX = 16_384  # a request line and headers; a browser's are under 2 KiB
_BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_TOO_LARGE = b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_TURN_S = 0.1  # the longest the serving thread sleeps: how soon it sees a stop or a deadline


@dataclass
class _Reading:
    """A connection whose request head is still arriving."""

    sock: socket.socket
    address: tuple[str, int]
    deadline: float
    head: bytearray = field(default_factory=bytearray)


class _SocketWriter(io.BufferedIOBase):
    """The handler's ``wfile``: every write is whole (``sendall``, under the socket's timeout)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sock.sendall(data)
        return len(data)


class BoundedHTTPServer:
    """Serves ``handler`` (a ``BaseHTTPRequestHandler``) on ``address``, within the limits above."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *, family: int,
                 connections_max: int, request_timeout_ms: int, workers_max: int) -> None:
        assert connections_max >= 1 and request_timeout_ms >= 1 and workers_max >= 1
        self.handler = handler
        self.connections_max = connections_max
        self.timeout_s = request_timeout_ms / 1000
        self.listener = socket.create_server(address, family=family, backlog=1024)  # queued in the kernel: no thread
        self.listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.reading: dict[int, _Reading] = {}  # by fd, oldest first
        self.answering = 0  # handed to the workers, not yet closed
        self.lock = threading.Lock()  # guards answering (workers decrement it)
        self.workers = ThreadPoolExecutor(workers_max, thread_name_prefix="http")
        self.stopping = threading.Event()
        self.dropped = 0  # connections closed for the limits (for the log)

    def serve(self) -> None:
        """The serving thread's loop, until ``stop``."""
        while not self.stopping.is_set():
            for key, _ in self.selector.select(_TURN_S):
                if key.fileobj is self.listener:
                    self._accept()
                elif (reading := self.reading.get(key.fd)) is not None:  # not dropped earlier this turn
                    self._read(reading)
            self._expire(time.monotonic())
        for reading in list(self.reading.values()):
            self._close(reading)
        self.selector.close()
        self.listener.close()

    def stop(self) -> None:
        self.stopping.set()
        self.workers.shutdown(wait=True, cancel_futures=True)

    def _accept(self) -> None:
        for _ in range(self.connections_max):  # bounded: the next turn takes the rest
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors, say: keep serving those we have
                log.warning("cannot accept a connection: %s", exc)
                return
            with self.lock:
                full = len(self.reading) + self.answering >= self.connections_max
            if full and self.reading:
                self._drop(next(iter(self.reading.values())))
            elif full:
                self._refuse(sock, _BUSY)
                continue
            sock.setblocking(False)
            self.reading[sock.fileno()] = _Reading(sock, address, time.monotonic() + self.timeout_s)
            self.selector.register(sock, selectors.EVENT_READ)

    def _read(self, reading: _Reading) -> None:
        try:
            data = reading.sock.recv(HEAD_BYTES_MAX + 1 - len(reading.head))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away before its request was whole: nothing to answer
            self._close(reading)
            return
        reading.head += data
        if b"\r\n\r\n" in reading.head or b"\n\n" in reading.head:
            self._hand_over(reading)
        elif len(reading.head) > HEAD_BYTES_MAX:
            self._forget(reading)
            self._refuse(reading.sock, _TOO_LARGE)

    def _expire(self, now: float) -> None:
        for reading in list(self.reading.values()):
            if reading.deadline > now:
                break  # oldest first: the rest are later
            self._drop(reading)

    def _hand_over(self, reading: _Reading) -> None:
        self._forget(reading)
        with self.lock:
            self.answering += 1
        self.workers.submit(self._answer, reading.sock, reading.address, bytes(reading.head))

    def _answer(self, sock: socket.socket, address: tuple[str, int], head: bytes) -> None:
        try:
            sock.setblocking(True)
            sock.settimeout(self.timeout_s)
            self.handler(_Request(sock, head), address, self)  # type: ignore[arg-type]
        except OSError as exc:  # the client left, or read nothing within the timeout
            log.debug("answer to %s not sent: %s", address, exc)
        finally:
            _shut(sock)
            with self.lock:
                self.answering -= 1

    def _forget(self, reading: _Reading) -> None:
        self.selector.unregister(reading.sock)
        del self.reading[reading.sock.fileno()]

    def _close(self, reading: _Reading) -> None:
        self._forget(reading)
        _shut(reading.sock)

    def _drop(self, reading: _Reading) -> None:
        self.dropped += 1
        if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
            log.warning("closed %d HTTP connections whose requests did not arrive in time or past "
                        "http_connections_max (%d)", self.dropped, self.connections_max)
        self._close(reading)

    def _refuse(self, sock: socket.socket, answer: bytes) -> None:
        self.dropped += 1
        try:
            sock.setblocking(False)
            sock.send(answer)  # best effort: a full buffer is not waited for
        except OSError:
            pass
        _shut(sock)


class _Request:
    """What the handler is given as its request: the socket, and the head already read."""

    def __init__(self, sock: socket.socket, head: bytes) -> None:
        self.sock = sock
        self.head = head


class PrereadHandler(BaseHTTPRequestHandler):
    """A ``BaseHTTPRequestHandler`` that reads the head the server has read, and writes to the socket."""

    def setup(self) -> None:
        request: _Request = self.request
        self.connection = request.sock
        self.rfile = io.BytesIO(request.head)
        self.wfile = _SocketWriter(request.sock)

    def finish(self) -> None:
        pass  # the server closes the socket


def _shut(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def serve_in_thread(server: BoundedHTTPServer, name: str) -> Callable[[], None]:
    """Start ``server`` on a daemon thread; return what stops it (and waits for its thread)."""
    thread = threading.Thread(target=server.serve, name=name, daemon=True)
    thread.start()

    def stop() -> None:
        server.stop()
        thread.join(timeout=5)

    return stop
