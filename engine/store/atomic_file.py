"""Whole-file replacement that survives a crash at any point.

write ``name.tmp`` -> fsync -> keep the previous version as ``name.bak`` ->
rename over ``name`` -> fsync the directory (RocketMQ ConfigManager#persist,
and the ALICE ordering rules). ``read_with_backup`` falls back to ``.bak``
when the main file is missing, empty or unparsable.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from engine.store.mapped_file import fsync_dir

T = TypeVar("T")


def write_atomically(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """``mode``: the file's permissions (0o600 for one that holds secrets: so is it from its first
    byte, and so is the ``.bak`` it leaves)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # a .tmp left by a crash keeps the mode it was made with
        view = memoryview(data)
        while view:  # a write the disk cuts short is followed by one that fails (ENOSPC)
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    if path.exists():
        os.replace(path, path.with_name(path.name + ".bak"))
    os.rename(tmp, path)
    fsync_dir(path.parent)


def read_with_backup(path: Path, parse: Callable[[bytes], T]) -> T | None:
    """Parse ``path``, or its ``.bak`` if the main copy is missing or bad; None if neither."""
    for candidate in (path, path.with_name(path.name + ".bak")):
        try:
            data = candidate.read_bytes()
        except FileNotFoundError:
            continue
        if not data:
            continue
        try:
            return parse(data)
        except ValueError:
            continue
    return None
