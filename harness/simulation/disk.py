"""A disk that remembers what was synced, and loses or tears the rest when the power goes.

The store's files are real files (in a tmpfs directory); this object listens to
every sync of a data file (``engine/store/sync.py``) and keeps a copy of the
bytes each sync made durable. ``power_cut`` then rewrites every data file as a
disk could have left it: each 4 KiB page that changed since its last sync is
kept (the kernel had written it back), lost (back to its synced bytes) or torn
(its first 512-byte sectors new, the rest old). File creations, renames and
unlinks are taken as durable at once (the store syncs the directory after each).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from engine.store import sync

PAGE_BYTES = 4096
SECTOR_BYTES = 512
DATA_DIRS = ("commitlog", "consumequeue", "index", "pop")


class SimDisk:
    def __init__(self, store_dir: Path) -> None:
        self.store_dir = store_dir
        self.synced: dict[Path, bytearray] = {}  # path -> the bytes on disk as of its last sync
        self.pages_lost = self.pages_torn = 0

    def __enter__(self) -> SimDisk:
        sync.listen(self.on_sync)
        return self

    def __exit__(self, *_exc: object) -> None:
        sync.listen(None)

    def on_sync(self, path: Path, start: int, end: int | None) -> None:
        try:
            with open(path, "rb") as f:
                data = f.read() if end is None else (f.seek(start), f.read(end - start))[1]
        except FileNotFoundError:
            return
        if end is None:  # the whole file, as it is now (a truncation included)
            self.synced[path] = bytearray(data)
            return
        image = self.synced.setdefault(path, bytearray())
        end = start + len(data)
        if len(image) < end:
            image.extend(bytes(end - len(image)))
        image[start:end] = data

    def power_cut(self, rng: random.Random, written_back_ratio: float = 1 / 3) -> None:
        """Leave every data file as the disk may hold it after the power went: of the pages written
        since their last sync, a share ``written_back_ratio`` is kept, and of the rest half is lost
        and half torn."""
        lost_below = written_back_ratio + (1 - written_back_ratio) / 2
        for path in sorted(self.data_files()):
            image = self.synced.get(path)
            if image is None:
                continue  # never synced: created by a path the store syncs whole before use
            current = path.read_bytes()
            result = bytearray(current)
            for at in range(0, len(current), PAGE_BYTES):
                new = current[at:at + PAGE_BYTES]
                old = bytes(image[at:at + PAGE_BYTES]).ljust(len(new), b"\x00")
                if new == old:
                    continue
                fate = rng.random()
                if fate < written_back_ratio:
                    continue  # written back before the cut
                if fate < lost_below:
                    result[at:at + len(new)] = old
                    self.pages_lost += 1
                else:
                    kept = rng.randrange(1, max(2, len(new) // SECTOR_BYTES)) * SECTOR_BYTES
                    result[at + kept:at + len(new)] = old[kept:]
                    self.pages_torn += 1
            if result != current:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.pwrite(fd, result, 0)
                finally:
                    os.close(fd)
            self.synced[path] = bytearray(result)
        for path in [p for p in self.synced if not p.exists()]:
            del self.synced[path]

    def data_files(self) -> list[Path]:
        files = []
        for name in DATA_DIRS:
            root = self.store_dir / name
            if root.is_dir():
                files += [p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".tmp")]
        return files
