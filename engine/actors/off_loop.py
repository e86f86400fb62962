"""One call at a time off an actor's loop: a thread runs it and wakes the loop when it is done.

The broker membership actor's work is etcd's requests, each up to ``etcd_request_timeout_ms`` per
endpoint; made from its loop, a slow etcd would stall the loop and with it the heartbeats the
supervisor judges it by. So the loop hands a step to this thread (at most one in flight, so a
step is bounded and steps never overlap), goes on, and takes the step's outcome when the thread
wakes it (``Actor.on_thread_wake``), as the writer takes a flush's from ``FileSyncer``.

Without a background (the simulation, ``Env.background`` False) the call runs at once, in the
caller's step: the simulation stays deterministic and single-threaded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class OffLoop:
    def __init__(self, name: str, wake: Callable[[], None], *, background: bool) -> None:
        self.name = name
        self.wake = wake
        self.background = background
        self._call: Callable[[], None] | None = None
        self._done = False  # the last call returned: ``take_done`` says so once
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def submit(self, call: Callable[[], None]) -> bool:
        """Run ``call`` off the loop; False (and nothing run) while the last one still runs."""
        with self._cond:
            if self._call is not None or self._closed:
                return False
            self._call = call
            if self.background:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=f"{self.name}-calls", daemon=True)
                    self._thread.start()
                self._cond.notify()
                return True
        self._finish(call)
        return True

    def take_done(self) -> bool:
        """True once after each call that finished (then the loop takes its outcome)."""
        with self._cond:
            done, self._done = self._done, False
            return done

    def close(self, timeout_s: float = 2.0) -> None:
        """No more calls; wait up to ``timeout_s`` for the one running."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._call is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                call = self._call
            assert call is not None
            self._finish(call)

    def _finish(self, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception:  # a bug of the step: the loop goes on, the next step tries again
            if not self.background:
                raise  # the simulation: a bug is a failed run, not a log line
            log.exception("%s: a call off the loop failed", self.name)
        finally:
            with self._cond:
                self._call = None
                self._done = True
        self.wake()
