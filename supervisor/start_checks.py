"""What a start checks before it writes anything, and how it says what went wrong.

A start refused here leaves the store as it was: another engine holding the
store's lock, a port that cannot be bound, are found without creating a file
(``Supervisor.start`` and ``start --detach`` run these checks first). The
supervisor binds nothing itself on TCP; its actors do, later, so a port taken
in between still fails the start, from the actor, quoting its last stderr line
(``last_line``).

A store directory the engine cannot write (a read-only mount, an immutable
directory, wrong ownership) is the operator's to fix: the start is refused,
naming it (``check_store_writable``), rather than serving with every send
refused. A disk that fills while the engine runs is not refused here: the
engine runs DEGRADED and says why (docs/operations.md).
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from pathlib import Path

import psutil

from engine.config import StoreConfig
from engine.ipc import endpoints
from engine.logs import LOG_DIR
from engine.offline.store_settings import SETTINGS_FILE, record_settings
from engine.store.commit_log import COMMIT_LOG_DIR
from engine.store.consume_queue import CONSUME_QUEUE_DIR
from engine.store.index_file import INDEX_DIR
from engine.store.pop_files import POP_DIR
from engine.store.shared_mapping_check import SharedMappingError, check_shared_mappings
from engine.store.timer_files import TIMER_LOG_DIR
from engine.store.topics import TOPICS_FILE

LOCK_FILE = "lock"  # flock'ed by the supervisor (its pid inside) and inherited by every actor
# The store's directories the actors create files in (the store directory itself first).
STORE_DIRS = ("", COMMIT_LOG_DIR, CONSUME_QUEUE_DIR, INDEX_DIR, str(TOPICS_FILE.parent), POP_DIR, TIMER_LOG_DIR)
_WRITE_PROBE = ".write-check"


class EngineError(RuntimeError):
    """The engine cannot start or keep running; the message says why."""


class StoreHeld(EngineError):
    """Another engine holds the store's lock."""


def lock_holder(store_dir: Path) -> int | None:
    """The pid of the engine holding ``store_dir``'s lock (0 if unknown), or None if nobody holds it.

    A shared ``flock`` fails while an engine (or one of its actors) holds the
    exclusive one; the probe writes nothing and creates nothing.
    """
    try:
        fd = os.open(store_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:  # no lock file (or no usable directory): nobody holds it; the start says what is wrong
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return int(text) if text.isdigit() else 0
    finally:
        os.close(fd)  # also releases the shared lock
    return None


def held_error(store_dir: Path, holder: int) -> StoreHeld:
    """The refusal: "another engine (pid N) is running on STORE at ENDPOINT" (from the run directory's state)."""
    try:
        endpoint = str(endpoints.read_engine_state(store_dir).get("endpoint", "?"))
    except endpoints.NotRunning:
        endpoint = "?"  # it holds the lock but has not written its state yet (starting) or has removed it
    if holder and not psutil.pid_exists(holder):  # the actors inherit the lock; PR_SET_PDEATHSIG stops them
        return StoreHeld(f"the actors of an engine whose supervisor (pid {holder}) was killed still hold "
                         f"{store_dir.resolve()}; they are stopping: try again in a few seconds")
    return StoreHeld(f"another engine (pid {holder or '?'}) is running on {store_dir.resolve()} at {endpoint}")


def check_store_free(store_dir: Path) -> None:
    holder = lock_holder(store_dir)
    if holder is not None:
        raise held_error(store_dir, holder)


def check_store_writable(store_dir: Path) -> None:
    """Create and remove a file in the store directory and in each of ``STORE_DIRS`` that exists:
    EngineError naming the first that refuses it ("cannot write in the store directory
    /srv/store/commitlog: Read-only file system"). A probe file, not ``os.access``: it finds
    what root's permission checks skip (a read-only mount, ``chattr +i``) as the actors would."""
    for name in STORE_DIRS:
        directory = store_dir / name
        if name and not directory.is_dir():
            continue  # created by the actor that writes it
        probe = directory / _WRITE_PROBE
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise EngineError(f"cannot write in the store directory {directory}: {exc.strerror or exc}") from None


def listening_addresses(config: StoreConfig) -> list[tuple[str, str]]:
    """(setting, host:port) of every TCP port the engine will listen on."""
    found = []
    if config.endpoint.startswith("tcp://"):
        found.append(("endpoint", config.endpoint[len("tcp://"):]))
    for key in ("metrics_endpoint", "dashboard_endpoint"):
        if getattr(config, key):
            found.append((key, getattr(config, key)))
    if config.grpc_enabled:
        found.append(("grpc_endpoint", config.grpc_endpoint))
    return found


def check_ports(config: StoreConfig) -> None:
    """Bind every port the engine will listen on, then let them go: a port in use fails the start here,
    naming its setting and address, before any actor runs or anything is written to the store.
    (A port taken between this check and the actor's bind still fails the start, from the actor.)"""
    held: list[socket.socket] = []
    try:
        for key, address in listening_addresses(config):
            host, port = address.rsplit(":", 1)
            host = host.strip("[]")
            host = "0.0.0.0" if host in ("*", "") else host
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ and http.server bind
            try:
                sock.bind((host, int(port)))
                sock.listen()
            except OSError as exc:
                raise EngineError(f"{exc.strerror or exc}: {address} ({key})") from None
    finally:
        for sock in held:
            sock.close()


def last_line(path: Path, offset: int = 0, *, prefix: str = "") -> str:
    """The last non-empty line of ``path`` past ``offset`` (starting with ``prefix``), "" if none:
    the reason a process gave on its stderr (a traceback's last line names the error)."""
    try:
        with open(path, "rb") as file:
            file.seek(offset)
            text = file.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith(prefix) and line.strip()]
    return lines[-1][:500] if lines else ""


def lock_store(store_dir: Path) -> int:
    """The store's lock, held for the engine's lifetime (the actors inherit the descriptor, so the
    store stays locked until the last one exits); its file holds the supervisor's pid."""
    lock_fd = os.open(store_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(lock_fd, 32, 0).decode(errors="replace").strip()
        os.close(lock_fd)
        raise held_error(store_dir, int(holder) if holder.isdigit() else 0) from None
    os.ftruncate(lock_fd, 0)
    os.pwrite(lock_fd, str(os.getpid()).encode(), 0)
    return lock_fd


def check_file_systems(store_dir: Path) -> None:
    """Refuse a store (or run directory) whose files the actors could not share through mmap: a
    FUSE mount with direct_io made the first actor to map a file die with "No such device"."""
    for directory in (store_dir, endpoints.ensure_run_dir(store_dir)):
        try:
            check_shared_mappings(directory)
        except SharedMappingError as exc:
            raise EngineError(str(exc)) from None


def lock_and_check(store_dir: Path, config: StoreConfig) -> int:
    """The checks of a start, and the store's lock (its descriptor). Nothing is created before the
    first two pass (a refused start leaves no trace); the ports are checked again holding the lock
    (an engine that started meanwhile binds them now); a store that cannot be written is refused.
    Once all pass, the store keeps the settings it starts with (``config/settings.json``), which
    the offline ``check`` reads when it is not given ``--config``."""
    check_store_free(store_dir)
    check_ports(config)
    try:
        (store_dir / LOG_DIR).mkdir(parents=True, exist_ok=True)
        lock_fd = lock_store(store_dir)
    except OSError as exc:
        raise EngineError(f"cannot use the store directory {store_dir}: {exc.strerror or exc}") from None
    try:
        check_ports(config)
        check_store_writable(store_dir)
    except EngineError:
        os.close(lock_fd)
        raise
    try:
        record_settings(store_dir, config)
    except OSError as exc:  # a full disk: the engine starts all the same (DEGRADED), the last copy stays
        print(f"warning: cannot keep the settings in {store_dir / SETTINGS_FILE} ({exc.strerror or exc}): "
              f"give `check` the store's --config", file=sys.stderr)
    return lock_fd
