"""``Channel``: a ``StoreClient`` that can also keep many requests in flight on its one socket.

A consumer of a topic long-polls every queue at once: one parked pull per queue, and
whichever queue gets a message first answers first. ``StoreClient`` waits for one
reply at a time and drops any other, so ``Channel`` adds two calls:

* ``submit(op, ...)`` sends a request and returns its id at once;
* ``replies(timeout_ms)`` waits for replies to submitted requests and returns them.

Every ``StoreClient`` operation still works in between (``commit_offset`` while pulls
are parked): ``request`` keeps the replies to submitted requests that arrive while it
waits for its own, and ``replies`` returns them later.

A request that gets no reply by its deadline is lost with the socket: as the protocol
asks (1.5), the channel then replaces its socket, so a late reply cannot be mistaken,
and every request still in flight is reported lost (``RequestTimeout``) for the caller
to send again. Not thread-safe, as ``StoreClient``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import zmq

from engine.client import ClientError, RequestTimeout, StoreClient, encode_request
from rmqpy.errors import engine_error

Outcome = dict[str, Any] | ClientError
"""A submitted request's end: its reply, or the ``EngineError`` or ``RequestTimeout`` it got."""


class Channel(StoreClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._deadlines: dict[int, float] = {}  # submitted, unanswered: id -> monotonic deadline
        self._arrived: dict[int, dict[str, Any]] = {}  # replies to submitted requests not yet handed out
        self._lost: list[int] = []  # submitted requests whose socket was replaced
        super().__init__(*args, **kwargs)

    def submit(self, op: str, *, wait_ms: int = 0, **fields: Any) -> int:
        """Send a request now and return its id; its reply comes from ``replies``.
        ``wait_ms``: the long-polling wait the request asks for, added to the deadline."""
        request_id = self._send(op, fields)
        self._deadlines[request_id] = time.monotonic() + (self.timeout_ms + wait_ms) / 1000
        return request_id

    @property
    def in_flight(self) -> int:
        return len(self._deadlines)

    def replies(self, timeout_ms: int) -> list[tuple[int, Outcome]]:
        """Wait up to ``timeout_ms`` for at least one submitted request to end; return every one that has."""
        ended = [(i, _outcome(r)) for i, r in self._pop_arrived()]
        ended += [(i, RequestTimeout(f"request {i} to {self.endpoint} was lost with its socket"))
                  for i in self._pop_lost()]
        deadline = time.monotonic() + (0 if ended else timeout_ms) / 1000
        while True:
            ended += [(i, _outcome(r)) for i, r in self._receive_ready()]
            now = time.monotonic()
            if any(d <= now for d in self._deadlines.values()):
                self._replace_socket()
                ended += [(i, RequestTimeout(f"no reply to request {i} from {self.endpoint} within its deadline"))
                          for i in self._pop_lost()]
            if ended or now >= deadline:
                return ended
            wake = min([deadline, *self._deadlines.values()])
            self._socket.poll(max(1, int((wake - now) * 1000)))

    def request(self, op: str, *, timeout_ms: int | None = None, **fields: Any) -> dict[str, Any]:
        """Send one request and wait for its reply (``StoreClient.request``), keeping the replies of others."""
        request_id = self._send(op, fields)
        deadline = time.monotonic() + (self.timeout_ms if timeout_ms is None else timeout_ms) / 1000
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not self._socket.poll(remaining_ms):
                self._replace_socket()
                raise RequestTimeout(f"no reply to {op!r} from {self.endpoint} within the deadline")
            reply = self._take()
            if reply is None:
                continue
            if reply.get("id") == request_id:
                break
            self._keep(reply)
        if not reply.get("ok"):
            raise engine_error(reply)
        return reply

    def _send(self, op: str, fields: dict[str, Any]) -> int:
        request_id = next(self._ids)
        self._submit(op, request_id, encode_request(op, request_id, fields, frame_bytes_max=self.frame_bytes_max))
        return request_id

    def _keep(self, reply: dict[str, Any]) -> None:
        """Keep a reply to a submitted request; drop any other (a late one, its request given up)."""
        request_id = reply.get("id")
        if isinstance(request_id, int) and self._deadlines.pop(request_id, None) is not None:
            self._arrived[request_id] = reply

    def _receive_ready(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """The replies to submitted requests that are already on the socket, without waiting."""
        while True:
            try:
                reply = self._take(zmq.NOBLOCK)
            except zmq.Again:
                break
            if reply is not None:
                self._keep(reply)
        yield from self._pop_arrived()

    def _pop_arrived(self) -> list[tuple[int, dict[str, Any]]]:
        arrived = list(self._arrived.items())
        self._arrived.clear()
        return arrived

    def _pop_lost(self) -> list[int]:
        lost = self._lost
        self._lost = []
        return lost

    def _replace_socket(self) -> None:
        self._socket.close()
        self._socket = self._connect()
        self._lost.extend(self._deadlines)
        self._deadlines.clear()


def _outcome(reply: dict[str, Any]) -> Outcome:
    return reply if reply.get("ok") else engine_error(reply)
