"""Talking to a running supervisor: control requests and its event stream.

Used by ``python -m supervisor stop|status``, by the monitor (the supervisor's status in the
metrics), by ``scripts/`` and by tests. It is a client of the supervisor's control socket, so it
sits with the other endpoints in ``engine/ipc``: the engine may use it without importing the
supervisor.
Every call has an absolute deadline; a supervisor that does not answer in
time raises ``ControlTimeout`` (a silent peer and a dead one look alike).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import zmq

from engine.ipc import endpoints
from engine.ipc.endpoints import NotRunning, read_engine_state
from engine.ipc.messages import ControlReply, ControlRequest, Event, control_reply_decoder, encoder, event_decoder

__all__ = ["ControlTimeout", "EventStream", "NotRunning", "control", "find_engine", "supervisor_state"]

# Where clients connect when told nothing else (engine.client.DEFAULT_ENDPOINT, the config's default).
DEFAULT_ENDPOINT = "tcp://127.0.0.1:10911"


class ControlTimeout(TimeoutError):
    """The supervisor did not answer before the deadline."""


def supervisor_state(store_dir: Path) -> dict[str, object]:
    """pid, endpoint and store of the supervisor running on ``store_dir``; NotRunning if none.

    The state file outlives a SIGKILLed supervisor (its run directory is
    removed only by a stop or the next start), so the pid must still be a
    live process: a dead one answers nothing and would cost a timeout.
    """
    state = read_engine_state(store_dir)
    pid = state.get("pid")
    if not (isinstance(pid, int) and _alive(pid)):
        raise NotRunning(f"no engine is running on {store_dir.resolve()} (its supervisor, pid {pid}, is gone "
                         f"without stopping; the next start recovers)")
    return state


# psutil ships no types: its process status and STATUS_* constants are str.
_STATUS_ZOMBIE: str = psutil.STATUS_ZOMBIE


def _alive(pid: int) -> bool:
    try:
        status: str = psutil.Process(pid).status()
        return status != _STATUS_ZOMBIE
    except psutil.Error:
        return False


def find_engine(store_dir: Path | None, endpoint: str | None, *, default_store: Path) -> tuple[Path, dict[str, object]]:
    """The store directory and state of the engine a server command means.

    ``--store-dir`` names it. Without it, ``default_store`` (./store) if an
    engine runs there (on ``endpoint``, if given); else the engine serving
    ``endpoint`` (default: the clients' default endpoint), as the client
    commands find it: every run directory under ``RUN_DIR_ROOT`` holds the
    state file of the engine it serves. Without ``--store-dir`` only an engine
    of this process's network and pid namespaces is found: the run directories
    may be shared with other namespaces, whose ``127.0.0.1`` and pids are not
    ours (a bare ``stop`` must not stop another namespace's engine). NotRunning
    names the paths looked at.
    """
    if store_dir is not None:
        return store_dir.resolve(), supervisor_state(store_dir)
    looked = default_store.resolve()
    try:
        state = supervisor_state(default_store)
        if (endpoint is None or state.get("endpoint") == endpoint) and endpoints.in_these_namespaces(state):
            return looked, state
    except NotRunning:
        pass
    wanted = endpoint or DEFAULT_ENDPOINT
    for path in sorted(endpoints.RUN_DIR_ROOT.glob(f"rmqpy-*/{endpoints.ENGINE_STATE_FILE}")):
        try:
            state = json.loads(path.read_text())
            store = Path(str(state["store_dir"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # another user's (mode 0700), or one being written
        pid = state.get("pid")
        if state.get("endpoint") == wanted and endpoints.in_these_namespaces(state) and isinstance(pid, int) \
                and _alive(pid) and endpoints.run_dir_for(store) == path.parent:
            return store, state
    raise NotRunning(f"no engine is running on {looked}, nor any serving {wanted}")


def control(store_dir: Path, request: ControlRequest, *, timeout_ms: int = 5000) -> ControlReply:
    """Send one control request (``StatusQuery``, ``StopCommand``, ``KillCommand``) and wait for the reply."""
    supervisor_state(store_dir)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = endpoints.configure(ctx.socket(zmq.DEALER), hwm=16)
    try:
        sock.connect(endpoints.ipc(endpoints.run_dir_for(store_dir), endpoints.SUPERVISOR_CONTROL))
        sock.send(encoder.encode(request))
        if not sock.poll(timeout_ms):
            raise ControlTimeout(f"the supervisor did not answer {request!r} within {timeout_ms} ms")
        return control_reply_decoder.decode(sock.recv())
    finally:
        sock.close()


class EventStream:
    """A subscription to the supervisor's events; ``wait_for`` blocks until one matches or the deadline.

    Events that arrive while waiting for another one are kept, so waiting for
    B then A finds A even if it came first.
    """

    def __init__(self, store_dir: Path) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.sock = endpoints.configure(ctx.socket(zmq.SUB), hwm=100_000)
        self.sock.setsockopt(zmq.SUBSCRIBE, endpoints.TOPIC_EVENT)
        self.sock.connect(endpoints.ipc(endpoints.run_dir_for(store_dir), endpoints.SUPERVISOR_EVENTS))
        self.seen: list[Event] = []
        self.backlog: list[Event] = []

    def wait_for(self, kind: str, *, name: str | None = None, timeout_ms: int = 30_000) -> Event:
        for i, event in enumerate(self.backlog):
            if event.kind == kind and (name is None or event.name == name):
                return self.backlog.pop(i)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not self.sock.poll(remaining_ms):
                raise ControlTimeout(f"no {kind!r} event for {name or 'any actor'} within {timeout_ms} ms; "
                                     f"saw {[(e.kind, e.name) for e in self.seen[-10:]]}")
            event = event_decoder.decode(self.sock.recv_multipart()[1])
            self.seen.append(event)
            if event.kind == kind and (name is None or event.name == name):
                return event
            self.backlog.append(event)

    def close(self) -> None:
        self.sock.close()
