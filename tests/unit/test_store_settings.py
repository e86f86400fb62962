"""The settings a store keeps of its last start (``config/settings.json``) and which settings the
offline commands read a store with: ``--config``'s, else the kept ones, else the defaults."""

from __future__ import annotations

from pathlib import Path

from engine.config import StoreConfig
from engine.offline.store_settings import SETTINGS_FILE, record_settings, recorded_settings, settings_for
from supervisor.launcher import write_config


def test_the_settings_of_the_last_start_are_read_back_and_a_torn_copy_falls_back_to_the_one_before(
        tmp_path: Path) -> None:
    assert recorded_settings(tmp_path) is None
    assert settings_for(tmp_path, None) == StoreConfig()
    first = StoreConfig.test_min().replace(index_hash_slot_count=777)
    record_settings(tmp_path, first)
    assert recorded_settings(tmp_path) == first
    second = first.replace(index_item_count_max=3_000)
    record_settings(tmp_path, second)
    assert settings_for(tmp_path, None) == second
    (tmp_path / SETTINGS_FILE).write_bytes(b'{"index_hash_slot_count": 7')  # a torn write
    assert recorded_settings(tmp_path) == first


def test_a_config_file_given_wins_over_the_kept_settings(tmp_path: Path) -> None:
    record_settings(tmp_path, StoreConfig.test_min())
    given = StoreConfig().replace(index_hash_slot_count=555)
    path = write_config(tmp_path / "engine.toml", given)
    assert settings_for(tmp_path, path).index_hash_slot_count == 555
