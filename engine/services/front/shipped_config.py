"""On a replica, the config files its master sends (``ConfigSnapshot``): when they changed.

The replication receiver replaces them whole (``engine/actors/replication_receiver.py``);
the front, which keeps them in memory, reads them again when ``changed`` says so (each tick).
"""

from __future__ import annotations

from pathlib import Path

from engine.services.replication.log_shipping import SHIPPED_CONFIG_FILES


class ShippedConfig:
    """The (inode, mtime ns, size) of each shipped file as last seen."""

    def __init__(self, store_dir: Path) -> None:
        self.paths = [store_dir / relative for relative in SHIPPED_CONFIG_FILES]
        self.seen = self._look()

    def _look(self) -> list[tuple[int, int, int] | None]:
        seen: list[tuple[int, int, int] | None] = []
        for path in self.paths:
            try:
                stat = path.stat()
            except FileNotFoundError:
                seen.append(None)
                continue
            seen.append((stat.st_ino, stat.st_mtime_ns, stat.st_size))
        return seen

    def changed(self) -> bool:
        now = self._look()
        changed, self.seen = now != self.seen, now
        return changed
