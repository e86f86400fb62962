"""Refuse, at start, a store whose file system cannot share mapped files between processes.

The actors are separate processes that share the store's files through ``mmap(MAP_SHARED)``:
an owner writes a ConsumeQueue through its mapping while the front and the timer read it
through theirs, a reader maps what the writer wrote with ``pwrite``. That needs one page cache
per file, seen by every mapping and by ``read``/``write``. Local file systems give it; a FUSE
mount gives it when it goes through the kernel's page cache (bindfs, LazyFS by default), but
not one mounted with ``direct_io``: there ``mmap(MAP_SHARED)`` fails with ENODEV (or, where the
server allows it, maps pages that ``read``/``write`` bypass). Without this check the first actor
to map a file died while starting with "[Errno 19] No such device", naming no reason.

The probe, a file of two pages in the store directory, removed afterwards::

    page 0: written through a writable mapping, then read by pread and by a second,
            read-only mapping made from another open (as another actor's would be)
    page 1: written by pwrite, then read through both mappings

``posix_fallocate`` is used the same way as for the store's files: where the file system has
no fallocate (FUSE mounts often have none: EOPNOTSUPP) glibc writes the blocks itself, which
gives the same guarantee (blocks exist before a page is written through a mapping).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from engine.store.mapped_file import PAGE_BYTES

PROBE_FILE = ".mapping-probe"
_PROBE_BYTES = 2 * PAGE_BYTES


class SharedMappingError(RuntimeError):
    """The store's file system cannot share mapped files between processes; carries the reason."""


def _refuse(directory: Path, what: str) -> SharedMappingError:
    return SharedMappingError(
        f"the file system of {directory} cannot share mapped files between processes ({what}); the actors "
        "share the store's files through mmap(MAP_SHARED). A FUSE mount must go through the page cache "
        "(mounted without direct_io); otherwise put the store on a local file system")


def check_shared_mappings(directory: Path) -> None:
    """SharedMappingError if files in ``directory`` cannot be mapped shared and kept coherent with
    ``read``/``write`` and with other mappings; OSError for any other failure (a full disk)."""
    path = directory / PROBE_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, _PROBE_BYTES)
        os.posix_fallocate(fd, 0, _PROBE_BYTES)
        try:
            writer = mmap.mmap(fd, _PROBE_BYTES, access=mmap.ACCESS_WRITE)
        except OSError as exc:
            raise _refuse(directory, f"mmap(MAP_SHARED) fails: {exc.strerror or exc}") from None
        try:
            _check_coherent(directory, path, fd, writer)
        finally:
            writer.close()
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def _check_coherent(directory: Path, path: Path, fd: int, writer: mmap.mmap) -> None:
    mapped_token, written_token = os.urandom(16), os.urandom(16)
    writer[:16] = mapped_token
    reader_fd = os.open(path, os.O_RDONLY)  # another open: what another actor does
    try:
        try:
            reader = mmap.mmap(reader_fd, _PROBE_BYTES, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise _refuse(directory, f"a second mmap(MAP_SHARED) fails: {exc.strerror or exc}") from None
        try:
            if os.pread(reader_fd, 16, 0) != mapped_token:
                raise _refuse(directory, "a write through a mapping is not seen by read()")
            if reader[:16] != mapped_token:
                raise _refuse(directory, "a write through a mapping is not seen by another mapping")
            os.pwrite(fd, written_token, PAGE_BYTES)
            if writer[PAGE_BYTES:PAGE_BYTES + 16] != written_token \
                    or reader[PAGE_BYTES:PAGE_BYTES + 16] != written_token:
                raise _refuse(directory, "a write() is not seen through the mappings")
        finally:
            reader.close()
    finally:
        os.close(reader_fd)
