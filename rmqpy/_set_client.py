"""``SetClient``: a ``StoreClient`` on a broker set's address, whose requests go to the set's master and
move with it (``rmqpy/_failover.py`` decides how); thread-safe.

    with SetClient("tcp://127.0.0.1:10911,tcp://127.0.0.1:10921,tcp://127.0.0.1:10931") as client:
        client.send("orders", [{"body": b"hello", "properties": {"UNIQ_KEY": key}}])

Every operation of ``StoreClient`` goes through ``request``, so each follows the master; a request
whose connection broke is sent again to the master found, and an operation that is not idempotent
(a send) should carry its own ids (``UNIQ_KEY``) so that a copy can be told. ``Producer`` sends
through one; the command line's ``produce`` on a set's address does too. Given one endpoint it is
a ``StoreClient`` that follows a named master, says within ``CONNECT_PROBE_MS`` that nothing
listens, and retries the refusals its retry policy names.

A thread holds the socket for one attempt at a time, not through a pause: threads sharing the
client wait for each other's replies, not for each other's back-off.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import zmq

from engine.client import CONNECT_PROBE_MS, ClientError, StoreClient
from engine.ipc.curve import CurveKeys
from rmqpy._failover import Follow, NoMaster, Pause, Raise, SetSend, Wait, find_master, master_role
from rmqpy.errors import ClientClosed
from rmqpy.retry import OnRetry, RetryPolicy

__all__ = ["SetClient"]


class SetClient(StoreClient):
    def __init__(self, address: str, *, timeout_ms: int = 10_000, retry: RetryPolicy | None = None,
                 on_retry: OnRetry | None = None, context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 curve: CurveKeys | None = None, wait_for_master: bool = True) -> None:
        """``address``: one engine, or a broker set's engines separated by commas (the first is tried
        first). ``retry``/``on_retry``: as ``Producer``'s. ``wait_for_master``: the default of
        ``request``'s (False: ``NoMaster`` while the set elects, for a caller that sends elsewhere)."""
        self.endpoints = [part.strip() for part in address.split(",") if part.strip()]
        if not self.endpoints:
            raise ValueError(f"no endpoint in {address!r}")
        one_engine = len(self.endpoints) == 1
        super().__init__(self.endpoints[0], timeout_ms=timeout_ms, context=context, curve=curve,
                         watch_connection=not one_engine, unreachable_ms=CONNECT_PROBE_MS if one_engine else None)
        self.retry = retry or RetryPolicy()
        self.on_retry = on_retry
        self.wait_for_master = wait_for_master
        self.resends = 0
        """Requests answered after being sent again because their connection broke: each may have
        been stored twice (a send's copies share their ``UNIQ_KEY`` of each message)."""
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            super().close()

    def request(self, op: str, *, timeout_ms: int | None = None, _followed: bool = False,
                wait_for_master: bool | None = None, **fields: Any) -> dict[str, Any]:
        """One request, at the set's master, until its deadline (``rmqpy/_failover.py``). Without
        ``wait_for_master``, ``NoMaster`` after the first round of looking that found none."""
        way = SetSend(self.timeout_ms if timeout_ms is None else timeout_ms, self.retry,
                      one_engine=len(self.endpoints) == 1)
        wait_for_master = self.wait_for_master if wait_for_master is None else wait_for_master
        while True:
            with self._lock:
                if self._closed:
                    raise ClientClosed(f"the client of {', '.join(self.endpoints)} is closed")
                endpoint = self.endpoint
                try:
                    reply = super().request(op, timeout_ms=way.remaining_ms(), _followed=True, **fields)
                    self.resends += way.broken
                    return reply
                except ClientError as exc:
                    step = way.after(exc, endpoint)
            if isinstance(step, Raise):
                raise step.error
            if isinstance(step, Wait):
                if step.pause_ms >= way.remaining_ms():
                    raise step.error
                time.sleep(step.pause_ms / 1000)  # the set's replicas follow its master again meanwhile
                continue
            if isinstance(step, Pause):
                if step.pause_ms >= way.remaining_ms():
                    raise step.error
                if self.on_retry is not None:
                    self.on_retry(step.error, step.retry, step.pause_ms)
                time.sleep(step.pause_ms / 1000)  # a pause the engine asked for, not a wait for some state
                continue
            master = step.master if isinstance(step, Follow) else None
            if master is not None and master_role(master, context=self._context, curve=self.curve) is None:
                master = None  # the master named is gone: an election is under way
            if master is None and not way.one_engine:
                master = self._look_for_master(endpoint, way, wait_for_master)
            if master is None:
                raise way.failure()
            self.move_to(master, leaving=endpoint)

    def _look_for_master(self, failed: str, way: SetSend, wait_for_master: bool) -> str:
        """The set's master, asked of its engines in rounds until the request's deadline."""
        while True:
            master = find_master(self.endpoints, failed, context=self._context, curve=self.curve)
            if master is not None:
                return master
            if not wait_for_master:
                raise NoMaster(self.endpoints, way.failure())
            pause_ms = way.look_pause_ms()
            if pause_ms >= way.remaining_ms():
                raise way.failure()
            time.sleep(pause_ms / 1000)  # the set elects its master meanwhile

    def move_to(self, master: str, *, leaving: str | None = None) -> None:
        """Send from now on to ``master`` (unless another thread moved the client off ``leaving`` first)."""
        with self._lock:
            if self._closed or master == self.endpoint or (leaving is not None and self.endpoint != leaving):
                return
            self.endpoint = master
            self._reconnect()
