"""The rebuild job: the engine's files reproduced, the engine's check agreed with, a damaged store repaired."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.layout import CQ_UNIT, INDEX_HEADER, INDEX_ITEM, INDEX_SLOT
from engine.offline.check import check_store
from engine.offline.repair import rebuild_derived
from engine.spark.rebuild import install_rebuilt, rebuild_store
from engine.store.commit_log import COMMIT_LOG_DIR
from engine.store.consume_queue import CONSUME_QUEUE_DIR, list_queues, queue_dir
from engine.store.index_file import INDEX_DIR, IndexService
from engine.store.mapped_file import list_files
from supervisor.launcher import write_config
from tests.spark.conftest import Store, copy_store
from tests.spark.dataset import rows_by_position

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_rebuild_reproduces_the_engines_queue_files_byte_for_byte_and_its_key_lookups(
        spark, stopped: Store, tmp_path: Path) -> None:
    report = rebuild_store(spark, stopped.path, tmp_path / "rebuilt", config=stopped.config)
    assert report.findings == [] == check_store(stopped.path, stopped.config)
    assert report.queue_differences == [] and report.index_differences == []
    assert report.records == len(stopped.sent.results)

    queues = list_queues(stopped.path)
    assert queues == list_queues(tmp_path / "rebuilt") and len(queues) == 6
    for topic, queue_id in queues:
        theirs = list_files(queue_dir(stopped.path, topic, queue_id))
        ours = list_files(queue_dir(tmp_path / "rebuilt", topic, queue_id))
        assert len(theirs) > 1 or topic == "burst"  # 100-unit files: every orders queue rolled
        assert [(o, p.read_bytes()) for o, p in ours] == [(o, p.read_bytes()) for o, p in theirs]

    config = stopped.config
    engine_index = IndexService(stopped.path, hash_slot_count=config.index_hash_slot_count,
                                index_count_max=config.index_item_count_max, writable=False)
    rebuilt_index = IndexService(tmp_path / "rebuilt", hash_slot_count=config.index_hash_slot_count,
                                 index_count_max=config.index_item_count_max, writable=False)
    try:
        assert rebuilt_index.file_count == engine_index.file_count > 2
        messages = rows_by_position(spark.read.format("rmq_store").load(str(stopped.path)).collect()).values()
        lookups = {(m["topic"], key) for m in messages for key in [*m["keys"], m["uniq_key"]]}
        assert len(lookups) > 2500
        for topic, key in lookups:
            found = rebuilt_index.query(topic, key, count_max=1000, begin_ms=0, end_ms=1 << 62)
            assert found == engine_index.query(topic, key, count_max=1000, begin_ms=0, end_ms=1 << 62)
            assert found
    finally:
        engine_index.close()
        rebuilt_index.close()


def damage(store: Path, config) -> None:  # config: a StoreConfig
    """A record body bit flip, a queue unit sent elsewhere, an index item sent elsewhere."""
    segment = list_files(store / COMMIT_LOG_DIR)[2][1]
    with open(segment, "r+b") as f:
        f.seek(20_000)
        byte = f.read(1)
        f.seek(20_000)
        f.write(bytes([byte[0] ^ 0x40]))
    cq_file = list_files(queue_dir(store, "orders", 1))[1][1]
    with open(cq_file, "r+b") as f:
        f.seek(7 * CQ_UNIT.size)
        offset, size, code = CQ_UNIT.unpack(f.read(CQ_UNIT.size))
        f.seek(7 * CQ_UNIT.size)
        f.write(CQ_UNIT.pack(offset + 1, size, code))
    index_file = sorted((store / INDEX_DIR).iterdir())[0]
    with open(index_file, "r+b") as f:
        position = INDEX_HEADER.size + config.index_hash_slot_count * INDEX_SLOT.size + 5 * INDEX_ITEM.size
        f.seek(position)
        key_hash, offset, diff, prev = INDEX_ITEM.unpack(f.read(INDEX_ITEM.size))
        f.seek(position)
        f.write(INDEX_ITEM.pack(key_hash, offset + 3, diff, prev))


@pytest.mark.slow
def test_on_a_damaged_store_the_job_finds_what_the_engine_check_finds_and_installs_what_repair_writes(
        spark, stopped: Store, tmp_path: Path) -> None:
    store = copy_store(stopped, tmp_path / "damaged")
    damage(store, stopped.config)
    reference = copy_store(Store(store, stopped.config, stopped.sent), tmp_path / "reference")
    expected = check_store(store, stopped.config)
    assert {f.area for f in expected} == {"commitlog", "consumequeue", "index"}

    report = rebuild_store(spark, store, tmp_path / "rebuilt", config=stopped.config)
    assert sorted(map(str, report.findings)) == sorted(map(str, expected))
    assert report.damaged_ranges == 1
    assert any(d.startswith("orders/1 ") for d in report.queue_differences)

    evidence = install_rebuilt(store, report)
    assert (evidence / CONSUME_QUEUE_DIR).is_dir() and (evidence / INDEX_DIR).is_dir()
    rebuild_derived(reference, stopped.config)  # the engine's own repair of the same damage
    assert check_store(store, stopped.config) == check_store(reference, stopped.config)
    assert derived_files(store) == derived_files(reference)


def derived_files(store: Path) -> dict[str, bytes]:
    """Queue files by path, index files by position (their names carry creation times)."""
    queues = {str(p.relative_to(store)): p.read_bytes() for p in (store / CONSUME_QUEUE_DIR).rglob("*") if p.is_file()}
    index = {f"index #{n}": p.read_bytes() for n, p in enumerate(sorted((store / INDEX_DIR).iterdir()))}
    return {**queues, **index}


@pytest.mark.slow
def test_the_rebuild_script_runs_on_its_own_and_exits_zero_on_a_healthy_store(stopped: Store, tmp_path: Path) -> None:
    store = copy_store(stopped, tmp_path / "store")
    config = write_config(tmp_path / "engine.toml", stopped.config)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "spark_rebuild.py"), "--store-dir", str(store),
                           "--output", str(tmp_path / "rebuilt"), "--config", str(config), "--master", "local[2]"],
                          capture_output=True, text=True, timeout=180, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(stopped.sent.results)} records, 0 damaged ranges" in done.stdout
    assert "findings (0):" in done.stdout
