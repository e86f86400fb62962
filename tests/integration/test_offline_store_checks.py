"""``inspect`` and ``check`` on a real store: they stop at the log's end, in bounded memory, and
refuse what is not a store (docs/operations.md, "Checking a store offline").

Segments are created at full size but sparse: with the default 1 GiB segment, a store of a
few hundred KB is 2 GiB of files that read as zeros past the data. Before the tools stopped at
the data's end, ``inspect`` reported the zeros as ``DAMAGE [...): bad magic`` and both tools
read them all: over 20 s and 2.1 GB of resident memory for a 285 KB store.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.cli import EXIT_FAILED, EXIT_OS_ERROR
from engine.config import GiB, StoreConfig
from engine.layout import index_file_bytes
from engine.offline.store_dir import LIVE_WARNING
from engine.store.index_file import INDEX_DIR
from supervisor.launcher import EngineProcess, write_config
from tests.helpers import wait_dispatched

pytestmark = pytest.mark.timeout(90)

CLI = [sys.executable, "-m", "engine"]
RSS_BYTES_MAX = 300 * 1024 * 1024  # far under one 1 GiB segment
# Runs the command as its only child and prints the child's peak resident set (KiB on Linux).
PEAK_RSS = ("import resource, subprocess, sys\n"
            "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "sys.stderr.write(done.stderr)\n"
            "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.stdout.write(done.stdout)\n")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, check=False)


def measured(*args: str) -> tuple[int, int, float, str, str]:
    """(exit code, peak RSS in bytes, seconds, stdout, stderr) of ``python -m engine ARGS``."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, *CLI, *args], capture_output=True, text=True,
                          timeout=80, check=True)
    took = time.monotonic() - started
    first, _, rest = done.stdout.partition("\n")
    code, peak_kib = map(int, first.split())
    return code, peak_kib * 1024, took, rest, done.stderr


@pytest.mark.timeout(120)
def test_a_healthy_store_with_1_gib_segments_is_read_to_its_end_only(store_dir: Path, tmp_path: Path) -> None:
    config = StoreConfig.test_min().replace(segment_size_bytes=1 * GiB)
    with EngineProcess(store_dir, config=config) as engine:
        client = engine.client()
        for batch in range(20):
            client.send("orders", [{"body": b"x" * 400, "keys": [f"k{batch}-{n}"]} for n in range(10)])
        wait_dispatched(client)
        client.close()
    assert (store_dir / "commitlog" / "00000000000000000000").stat().st_size == 1 * GiB
    toml = str(write_config(tmp_path / "store.toml", config))

    code, peak, took, out, err = measured("inspect", "--store-dir", str(store_dir), "--config", toml)
    assert code == 0, err
    assert "DAMAGE" not in out, out
    assert "orders/" in out and "@0 size=" in out
    assert peak < RSS_BYTES_MAX, f"inspect peaked at {peak >> 20} MiB resident"
    assert took < 15, f"inspect took {took:.1f} s"

    code, peak, took, out, err = measured("check", "--store-dir", str(store_dir), "--config", toml)
    assert code == 0, out + err
    assert "no problems found" in out
    assert peak < RSS_BYTES_MAX, f"check peaked at {peak >> 20} MiB resident"
    assert took < 15, f"check took {took:.1f} s"


@pytest.mark.timeout(90)
def test_a_store_is_checked_and_repaired_with_the_settings_of_its_last_start_without_its_config(
        store_dir: Path) -> None:
    """The sizes of IndexFiles are settings the files do not say: ``check`` without ``--config`` took
    the defaults and found every IndexFile of a store started otherwise (a cluster's engine's, whose
    TOML ``cluster start`` wrote) of the wrong size. The store keeps the settings of its last start."""
    config = StoreConfig.test_min().replace(index_hash_slot_count=777, index_item_count_max=3_000)  # not the defaults
    assert (config.index_hash_slot_count, config.index_item_count_max) != \
        (StoreConfig().index_hash_slot_count, StoreConfig().index_item_count_max)
    with EngineProcess(store_dir, config=config) as engine:
        client = engine.client()
        client.send("orders", [{"body": b"keyed", "keys": [f"k{n}"]} for n in range(50)])
        wait_dispatched(client)
        client.close()
    index_files = sorted((store_dir / INDEX_DIR).iterdir())
    assert index_files
    size = index_file_bytes(hash_slot_count=777, index_count=3_000)
    assert [path.stat().st_size for path in index_files] == [size] * len(index_files)

    checked = run("check", "--store-dir", str(store_dir))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "no problems found" in checked.stdout
    repaired = run("check", "--repair", "--store-dir", str(store_dir))  # rebuilt with the same sizes
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert [path.stat().st_size for path in sorted((store_dir / INDEX_DIR).iterdir())] == [size] * len(index_files)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [["inspect"], ["check"], ["check", "--repair"]])
def test_a_path_that_is_not_a_store_is_refused(command: list[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    regular = tmp_path / "file"
    regular.write_text("not a store\n")
    for path, says in ((tmp_path / "nonexistent", "does not exist"), (empty, "is not a store directory"),
                       (regular, "is not a directory")):
        result = run(*command, "--store-dir", str(path))
        assert result.returncode == EXIT_OS_ERROR, (path, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
        assert result.stderr.startswith("error: ") and says in result.stderr, result.stderr
        assert "no problems found" not in result.stdout
    assert sorted(p.name for p in empty.iterdir()) == [], "a refused command created files"


@pytest.mark.timeout(60)
def test_a_live_store_is_read_with_a_warning_and_never_repaired(engine: EngineProcess, tmp_path: Path) -> None:
    client = engine.client()
    client.send("orders", [{"body": b"live", "keys": ["k1"]}])
    wait_dispatched(client)
    client.close()
    store = str(engine.store_dir)
    toml = str(write_config(tmp_path / "store.toml", engine.config))

    for command in (["check"], ["inspect"]):
        result = run(*command, "--store-dir", store, "--config", toml)
        assert result.returncode == 0, (command, result.stdout, result.stderr)
        assert f"warning: {LIVE_WARNING}" in result.stderr.splitlines(), result.stderr

    before = sorted(p.name for p in engine.store_dir.iterdir())
    result = run("check", "--repair", "--store-dir", store, "--config", toml)
    assert result.returncode == EXIT_FAILED, (result.stdout, result.stderr)
    assert "an engine is running" in result.stderr and "stop it" in result.stderr
    assert sorted(p.name for p in engine.store_dir.iterdir()) == before, "repair touched a live store"
