"""An engine whose timer and transaction check run on short intervals."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.config import StoreConfig
from supervisor.launcher import EngineProcess
from tests.helpers import engine_with_topics

TOPIC = "later"


def timer_config(**changes: object) -> StoreConfig:
    return StoreConfig.test_min().replace(timer_checkpoint_interval_ms=100, transaction_timeout_ms=300,
                                          transaction_check_interval_ms=200, **changes)


@pytest.fixture
def timed_engine(store_dir: Path) -> Iterator[EngineProcess]:
    with engine_with_topics(store_dir, timer_config(), {TOPIC: 2}) as engine:
        yield engine
