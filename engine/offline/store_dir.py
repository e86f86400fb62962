"""What the offline tools check before they read a store: that it is one, and whether an engine runs on it.

A store is recognised by its layout: a directory with a ``commitlog/``
directory (every engine that started has one, and so has a RocketMQ
broker's store), or at least the ``lock`` file an engine takes when it
starts. A missing path, a regular file or an empty directory is refused
(``NotAStore``, an OSError: the CLI's exit code for a local file error),
never reported as a store with "no problems found".

A running engine holds an exclusive ``flock`` on ``lock`` for its lifetime
(the supervisor takes it and every actor inherits it). A shared, non-blocking
``flock`` fails while it is held: the probe creates nothing and writes nothing.
Reading a live store is allowed, but what is read is a moment's and may
change while it is read; writing one (``check --repair``) is refused.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from engine.store.commit_log import COMMIT_LOG_DIR

LOCK_FILE = "lock"  # flock'ed by a running engine (supervisor/start_checks.py)
LIVE_WARNING = "an engine is running on this store: the figures are a moment's and may change"


class NotAStore(OSError):
    """The path given as a store directory is not one."""


def require_store(store_dir: Path) -> None:
    """NotAStore unless ``store_dir`` is a store directory."""
    if not store_dir.exists():
        raise NotAStore(f"{store_dir} does not exist; give a store directory")
    if not store_dir.is_dir():
        raise NotAStore(f"{store_dir} is not a directory; give a store directory")
    if not (store_dir / COMMIT_LOG_DIR).is_dir() and not (store_dir / LOCK_FILE).is_file():
        raise NotAStore(f"{store_dir} is not a store directory (it has no {COMMIT_LOG_DIR}/ and no {LOCK_FILE} file)")


def engine_running(store_dir: Path) -> bool:
    """True while an engine holds the store's lock."""
    try:
        fd = os.open(store_dir / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return False  # no engine ever started here (a copy of a broker's store)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the shared lock
    return False
