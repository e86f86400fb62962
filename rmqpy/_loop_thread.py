"""An asyncio event loop on a thread of its own, for blocking code that hands it coroutines.

``Producer.send_async`` runs an ``AsyncProducer`` here: the loop's thread is the only
one that touches that producer's socket (ZeroMQ sockets are not thread-safe), while
``submit`` may be called from any thread (``asyncio.run_coroutine_threadsafe``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)  # never holds up an exit
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` on the loop; thread-safe."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def stop(self, last: Coroutine[Any, Any, object] | None = None, *, timeout_s: float = 30.0) -> None:
        """Run ``last`` (a clean-up), then stop the loop, cancel what is left and join the thread."""
        try:
            if last is not None:
                self.submit(last).result(timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
