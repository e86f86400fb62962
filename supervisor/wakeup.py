"""A socket that wakes the supervisor's poll when a signal arrives."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def signal_wakeup() -> Iterator[socket.socket | None]:
    """A socket that turns readable when a signal arrives (``signal.set_wakeup_fd``); None off the
    main thread, where Python allows no wakeup fd."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    try:
        yield reader
    finally:
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()


def drain(sock: socket.socket) -> None:
    sock.setblocking(False)
    try:
        while sock.recv(4096):
            pass
    except BlockingIOError:
        pass
