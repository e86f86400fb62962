"""How a send moves over a broker set's engines until its deadline (docs/replication.md, "Clients").

A producer given a broker set's address (its engines, comma-separated) sends to the engine it
takes for the master. What it does after a failure is decided here, the same for the blocking
and the asyncio producer (``SetSend.after``), and carried out by them:

* ``Follow``: a ``NOT_MASTER`` named another engine as the master: send there at once (the
  refusing engine stored nothing).
* ``Look``: the engine is gone (the connection broke, was refused, or answered no heartbeat for
  ``HEARTBEAT_TIMEOUT_MS``) or an election is under way (``NOT_MASTER`` naming nobody): ask the
  set's engines who the master is (``find_master``), pausing between rounds, then send the same
  request there. A request whose connection broke may have been stored: it goes again with the
  same ``UNIQ_KEY`` of each message, so a consumer can drop the copy by it.
* ``Pause``: a refusal the retry policy retries (``BUSY``, ``SERVICE_NOT_AVAILABLE``,
  ``SLAVE_NOT_AVAILABLE`` from one engine): the same engine after the policy's pause.
* ``Wait``: a set's master refused with ``SLAVE_NOT_AVAILABLE`` (too few replicas in sync: a new
  master whose replicas are following it again, or a replica just lost): the same engine again
  after the look's pause, until the deadline, not counted against the policy's retries.
* ``Raise``: any other refusal, and a timeout (a master that took the request and answered
  nothing may have stored it: it is not sent again).

A send keeps one deadline for all of it: the producer's ``timeout_ms`` from the call. When it
passes while no master is found, the last failure is raised. A producer on one engine follows a
named master too, but has nowhere else to look: there an election's ``NOT_MASTER`` is retried as
the policy says, and a refused connection is raised.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from engine.client import ClientError, ConnectionLost, EngineError, EngineUnreachable, StoreClient
from engine.errors import ErrorCode
from engine.ipc.curve import CurveKeys
from rmqpy._send import master_named
from rmqpy.errors import NoMaster
from rmqpy.retry import RetryPolicy

__all__ = ["Follow", "Look", "NoMaster", "PassedOver", "Pause", "Raise", "SetSend", "Wait", "find_master",
           "master_role"]

ROUTE_PROBE_MS = 500  # the longest an engine may take to say whether it is the master
LOOK_PAUSE_MS_MIN = 50  # the pause after a round of looking that found no master, doubling ...
LOOK_PAUSE_MS_MAX = 100  # ... up to this: a master elected is found within about this (a round is cheap)
SET_RECHECK_MS = 1_000  # how often a cluster's producer asks a set passed over whether it has a master

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Follow:
    master: str


@dataclass(frozen=True)
class Look:
    pass


@dataclass(frozen=True)
class Pause:
    error: EngineError
    retry: int
    pause_ms: float


@dataclass(frozen=True)
class Wait:
    error: EngineError
    pause_ms: float


@dataclass(frozen=True)
class Raise:
    error: ClientError


Step = Follow | Look | Pause | Wait | Raise


class SetSend:
    """One send's attempts over a broker set, up to its deadline."""

    def __init__(self, timeout_ms: int, retry: RetryPolicy, *, one_engine: bool) -> None:
        self.deadline = time.monotonic() + timeout_ms / 1000
        self.retry = retry
        self.one_engine = one_engine
        self.refusals = 0  # the retry policy's retries so far
        self.looks = 0  # rounds of looking for the master that found none
        self.waits = 0  # a master's SLAVE_NOT_AVAILABLE so far
        self.broken = False  # a connection broke (or was refused) under it: a resend may store it twice
        self.last_error: ClientError | None = None

    def remaining_ms(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))

    def after(self, error: ClientError, endpoint: str) -> Step:
        """What to do after ``error`` from the engine at ``endpoint``."""
        self.last_error = error
        if not isinstance(error, EngineError):
            gone = isinstance(error, ConnectionLost | EngineUnreachable) and not self.one_engine
            self.broken |= isinstance(error, ConnectionLost)
            return Look() if gone else Raise(error)
        master = master_named(error, endpoint)
        step: Step = Raise(error)
        if master is not None:
            step = Follow(master)
        elif error.code == ErrorCode.NOT_MASTER and not self.one_engine:
            step = Look()
        elif error.code == ErrorCode.SLAVE_NOT_AVAILABLE and not self.one_engine:
            self.waits += 1
            step = Wait(error, self.pause_ms(self.waits))
        elif error.code in self.retry.retriable_codes and self.refusals < self.retry.retry_count_max:
            self.refusals += 1
            step = Pause(error, self.refusals, self.retry.backoff_ms(self.refusals, jitter=random.random()))
        return step

    def look_pause_ms(self) -> float:
        """The pause after a round that found no master (growing with each round)."""
        self.looks += 1
        return self.pause_ms(self.looks)

    @staticmethod
    def pause_ms(rounds: int) -> float:
        """The pause after ``rounds`` rounds of looking, or of a master's ``SLAVE_NOT_AVAILABLE``."""
        return float(min(LOOK_PAUSE_MS_MAX, LOOK_PAUSE_MS_MIN * 2 ** min(rounds - 1, 16)))

    def failure(self) -> ClientError:
        """What the send raises when its deadline passes without a master."""
        assert self.last_error is not None
        return self.last_error


def master_role(endpoint: str, *, context: zmq.Context[zmq.Socket[bytes]] | None = None,
                curve: CurveKeys | None = None) -> int | None:
    """The epoch of ``endpoint`` if it answers, within ``ROUTE_PROBE_MS``, that it is its set's master."""
    try:
        with StoreClient(endpoint, timeout_ms=ROUTE_PROBE_MS, context=context, curve=curve, watch_connection=True,
                         direct_replies=False) as client:
            route = client.route()
    except ClientError:
        return None
    epoch = route.get("epoch")
    return epoch if route.get("role") == "master" and isinstance(epoch, int) else None


def find_master(endpoints: list[str], failed: str, *, context: zmq.Context[zmq.Socket[bytes]] | None = None,
                curve: CurveKeys | None = None) -> str | None:
    """The engine of the set that says it is the master (the higher epoch if two do: an old master not
    yet told), asking ``failed`` only when no other does; None when none does."""
    found: tuple[int, str] | None = None
    for endpoint in [e for e in endpoints if e != failed]:
        epoch = master_role(endpoint, context=context, curve=curve)
        if epoch is not None and (found is None or epoch > found[0]):
            found = (epoch, endpoint)
    if found is None and failed in endpoints:
        epoch = master_role(failed, context=context, curve=curve)
        found = (epoch, failed) if epoch is not None else None
    return found[1] if found is not None else None


class PassedOver:
    """The broker sets a cluster's producer passes over while they have no master. Each is watched by
    a thread of its own that asks its engines for the master every ``recheck_ms`` and, once one
    answers, calls ``found(broker, master)`` and lets the set take sends again."""

    def __init__(self, found: Callable[[str, str], None], *, recheck_ms: int = SET_RECHECK_MS,
                 curve: CurveKeys | None = None) -> None:
        self._found = found
        self._recheck_ms = recheck_ms
        self._curve = curve
        self._watched: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def __contains__(self, broker: str) -> bool:
        with self._lock:
            return broker in self._watched

    def mark(self, broker: str, endpoints: list[str], failed: str) -> None:
        """Pass ``broker`` over until its engines name a master."""
        with self._lock:
            if broker in self._watched or self._closed.is_set():
                return
            log.warning("broker set %s has no master: keyless sends go to the other sets until it has", broker)
            thread = threading.Thread(target=self._watch, args=(broker, endpoints, failed), daemon=True,
                                      name=f"rmqpy-no-master-{broker}")
            self._watched[broker] = thread
        thread.start()

    def _watch(self, broker: str, endpoints: list[str], failed: str) -> None:
        try:
            while not self._closed.wait(self._recheck_ms / 1000):  # a pace, not a wait for some state
                master = find_master(endpoints, failed, curve=self._curve)
                if master is not None:
                    self._found(broker, master)
                    return
        finally:
            with self._lock:
                del self._watched[broker]

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            threads = list(self._watched.values())
        for thread in threads:
            thread.join()
