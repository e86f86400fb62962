"""Network namespaces (``ip netns``): made, entered by one thread, emptied and deleted.

A namespace made here is named ``rmqtb<owner pid>-<name>``: a later test bed deletes the ones
whose owner died without deleting them (``sweep_stale``), after killing what still runs there.
A process runs "on" a namespace through ``ip netns exec`` (which execs the command: its pid is
the command's); a thread of this process enters one with setns(2) (``entered``), for sockets it
makes itself (``run_in``).
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import psutil

PREFIX = "rmqtb"
CLONE_NEWNET = 0x40000000  # <sched.h>
_GONE_WAIT_S = 10.0
_OWNED = re.compile(rf"^{PREFIX}(\d+)-")

T = TypeVar("T")


class NetnsError(RuntimeError):
    pass


def ip(*args: str) -> str:
    """``ip ARGS``; its output, or ``NetnsError`` with what it said."""
    return _run(["ip", *args])


def nft_in(namespace: str, script: str) -> None:
    """An nftables script (``nft -f -``) run in ``namespace``."""
    _run([*exec_prefix(namespace), "nft", "-f", "-"], script)


def _run(argv: list[str], stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def owned_name(name: str) -> str:
    return f"{PREFIX}{os.getpid()}-{name}"


def exec_prefix(namespace: str) -> list[str]:
    """The words before a command that runs it in ``namespace``."""
    return ["ip", "netns", "exec", namespace]


def namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def create(namespace: str) -> None:
    ip("netns", "add", namespace)
    ip("-n", namespace, "link", "set", "lo", "up")


def delete(namespace: str) -> None:
    """Kill (SIGKILL) every process of ``namespace``, wait for them, and delete it."""
    deadline = time.monotonic() + _GONE_WAIT_S
    while pids := [int(pid) for pid in ip("netns", "pids", namespace).split()]:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        psutil.wait_procs([p for p in map(_process, pids) if p is not None], timeout=1.0)
        if time.monotonic() > deadline:
            raise NetnsError(f"processes of {namespace} outlived SIGKILL: {pids}")
    ip("netns", "del", namespace)


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def sweep_stale() -> list[str]:
    """Delete the namespaces of test beds whose owner process has died; their names."""
    swept = []
    for namespace in namespaces():
        owned = _OWNED.match(namespace)
        if owned is not None and not psutil.pid_exists(int(owned.group(1))):
            delete(namespace)
            swept.append(namespace)
    return swept


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


@contextmanager
def entered(namespace: str) -> Iterator[None]:
    """The calling thread in ``namespace`` (setns(2) moves one thread); back where it was after.
    A socket keeps the namespace it was made in."""
    with open("/proc/thread-self/ns/net", "rb") as home, open(f"/run/netns/{namespace}", "rb") as there:
        _setns(there.fileno())
        try:
            yield
        finally:
            _setns(home.fileno())


def run_in(namespace: str, fn: Callable[[], T]) -> T:
    """``fn()`` on a thread of its own inside ``namespace`` (this thread never leaves its own)."""
    result: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            with entered(namespace):
                result.append(fn())
        except BaseException as exc:  # handed to the caller
            failure.append(exc)

    thread = threading.Thread(target=body, name=f"in {namespace}", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
