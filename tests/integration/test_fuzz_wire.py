"""2,000 seeded hostile requests against a live engine (harness/wire_fuzz.py, scripts/fuzz_wire.py).

Every request is answered with a documented code, or not at all where the protocol
says so; no actor restarts; memory stays bounded; no file is made from a fuzzed
name; the messages stored before are intact; ``check`` finds nothing afterwards.
``RMQPY_FUZZ_SEED`` picks another seed (the default one is fixed so a red run
reproduces); ``scripts/fuzz_wire.py`` runs any number.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from engine.config import StoreConfig
from engine.offline.check import check_store
from harness import wire_fuzz
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(300)

REQUESTS = 2_000


def test_two_thousand_hostile_requests_are_answered_as_documented_and_hurt_nothing(store_dir: Path) -> None:
    seed = int(os.environ.get("RMQPY_FUZZ_SEED", "20261124"))
    engine = EngineProcess(store_dir, config=StoreConfig.test_min().replace(long_poll_wait_ms_max=2_000))
    engine.start()
    try:
        with engine.client() as client:
            known = wire_fuzz.store_known(client)
        flood = REQUESTS // 5
        report = wire_fuzz.run(engine.endpoint, engine.config, seed=seed, count=REQUESTS - flood, flood_count=flood)
        assert report.requests == REQUESTS
        assert report.violations == [], f"seed {seed}: {report.violations[:20]}"
        assert {"garbage", "wrong-type", "bad-name", "frames", "oversized-frame"} <= set(report.by_kind)
        problems = wire_fuzz.after_checks(engine, known, search_dirs=[store_dir.parent, Path(tempfile.gettempdir())])
        assert problems == [], f"seed {seed}: {problems}"
    finally:
        engine.stop()
    assert check_store(store_dir, engine.config) == []
