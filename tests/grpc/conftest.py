"""An engine with the gRPC endpoint on, and the official RocketMQ 5 Python client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from rocketmq import ClientConfiguration, Credentials

from engine.config import StoreConfig
from supervisor.launcher import EngineProcess, free_port


def grpc_config(**overrides: object) -> StoreConfig:
    """The test preset with the endpoint on a free port; short retry delays and 3 attempts, so
    that redeliveries and dead letters happen within a test."""
    return StoreConfig.test_min().replace(grpc_enabled=True, grpc_endpoint=f"127.0.0.1:{free_port()}",
                                          max_delivery_attempts=3, grpc_retry_delays_ms=(1_000,),
                                          grpc_long_polling_ms=2_000, transaction_timeout_ms=1_000,
                                          transaction_check_interval_ms=1_000, **overrides)


def official(engine: EngineProcess) -> ClientConfiguration:
    return ClientConfiguration(engine.config.grpc_endpoint, Credentials(), request_timeout=10)


@pytest.fixture(scope="module")
def grpc_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    process = EngineProcess(tmp_path_factory.mktemp("grpc") / "store", config=grpc_config())
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def own_engine(store_dir: Path) -> Iterator[EngineProcess]:
    """An engine for one test (which may kill its actors)."""
    process = EngineProcess(store_dir, config=grpc_config())
    process.start()
    try:
        yield process
    finally:
        process.stop()
