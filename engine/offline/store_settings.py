"""The settings a store was last started with, kept in the store: ``config/settings.json``.

The sizes of a store's IndexFiles (``index_hash_slot_count``, ``index_item_count_max``) and of its
timer files are settings its files do not say. Each start writes the engine's settings here, under
the store's lock (``supervisor.start_checks.lock_and_check``), so that the offline commands
(``check``, ``check --repair``, ``inspect``) read the store with the settings it was written with
when they are not given its ``--config`` (docs/operations.md, section 8). It is the same JSON the
supervisor hands its actors (``engine.config.encode_config``); it is not shipped to replicas (each
engine of a broker set records its own).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from engine.config import StoreConfig, decode_config, encode_config
from engine.store.atomic_file import read_with_backup, write_atomically

SETTINGS_FILE = Path("config") / "settings.json"


def record_settings(store_dir: Path, config: StoreConfig) -> None:
    """Keep ``config`` in the store as the settings it was last started with (OSError if it cannot)."""
    write_atomically(store_dir / SETTINGS_FILE, encode_config(config))


def recorded_settings(store_dir: Path) -> StoreConfig | None:
    """The settings the store was last started with; None if no start recorded any (a store of an
    older version, or a copy of one without its ``config/``), or neither copy reads."""
    return read_with_backup(store_dir / SETTINGS_FILE, _parse)


def _parse(data: bytes) -> StoreConfig:
    try:
        return decode_config(data)  # a ConfigError (invalid values) is a ValueError already
    except msgspec.MsgspecError as exc:
        raise ValueError(str(exc)) from exc


def settings_for(store_dir: Path, config_path: Path | None) -> StoreConfig:
    """The settings an offline command reads ``store_dir`` with: the ``--config`` file if given,
    else those the store was last started with, else the defaults."""
    if config_path is not None:
        return StoreConfig.load(config_path)
    if not (store_dir / SETTINGS_FILE.parent).is_dir():  # not a store (the command says so), or none kept
        return StoreConfig.load(None)
    return recorded_settings(store_dir) or StoreConfig.load(None)
