"""Fixtures of the PySpark connector tests: one SparkSession per run, and stores the engine made.

* ``spark``: local[2], 1 GiB driver, UI off, 2 shuffle partitions, Python
  filter pushdown on; its JVM is stopped (and waited for) at the end.
* ``live``: an engine that keeps running for the whole run, holding
  ``DATASET`` (tests that add messages use topics of their own).
* ``stopped``: another engine's store holding ``DATASET``, stopped cleanly.
  Tests that damage a store work on a copy (``copy_store``).

The stores use small files (256 KiB segments, 100-unit queue files, 1000-item
index files with 97 hash slots) so that every structure rolls over several
files and index chains collide.

These tests need the ``spark`` extra (pyspark, pyarrow) and Java 17; without
them they fail rather than skip.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
    # A clear message instead of a skip: CI must run these tests.
    raise ImportError("tests/spark need the spark extra: pip install -e '.[spark]'")

from engine.config import KiB, StoreConfig  # after the check above
from engine.spark.session import build_session, stop_session
from supervisor.launcher import EngineProcess
from tests.spark.dataset import DATASET_TOPICS, Sent, send_dataset

SPARK_CONFIG = StoreConfig.test_min().replace(
    segment_size_bytes=256 * KiB, message_body_bytes_max=64 * KiB, send_batch_bytes_max=64 * KiB,
    consume_queue_file_units=100, index_item_count_max=1000, index_hash_slot_count=97)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = build_session(master="local[2]", app_name="rmq-tests", driver_memory="1g", conf={
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.python.filterPushdown.enabled": "true",
    })
    try:
        yield session
    finally:
        stop_session(session)


@dataclass
class Store:
    """A store the engine wrote, and what was sent into it."""

    path: Path
    config: StoreConfig
    sent: Sent
    engine: EngineProcess | None = None  # running (live) or None (stopped)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        assert self.engine is not None
        return self.engine.endpoint


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    engine = EngineProcess(tmp_path_factory.mktemp("live") / "store", config=SPARK_CONFIG)
    engine.start()
    try:
        with engine.client() as client:
            sent = send_dataset(client, seed=7)
        yield Store(engine.store_dir, engine.config, sent, engine)
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Store:
    engine = EngineProcess(tmp_path_factory.mktemp("stopped") / "store", config=SPARK_CONFIG)
    engine.start()
    try:
        with engine.client() as client:
            sent = send_dataset(client, seed=11)
    finally:
        assert engine.stop() == 0
    return Store(engine.store_dir, engine.config, sent)


def copy_store(store: Store, destination: Path) -> Path:
    """A copy of a stopped store's files (without its lock), to damage or repair."""
    shutil.copytree(store.path, destination, ignore=shutil.ignore_patterns("lock", "logs"))
    return destination


__all__ = ["DATASET_TOPICS", "SPARK_CONFIG", "Store", "copy_store"]
