"""The Makefile's set-up on a fresh machine: what it installs, and in which order.

``make -n`` prints the recipe without running it, so these tests read what a
fresh clone would do (no virtualenv, no stamps) without installing anything.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make") or "/usr/bin/make"


def dry_run(tmp_path: Path, *targets: str) -> list[str]:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    for name in ("pyproject.toml", "setup.py"):
        (tmp_path / name).touch()
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "_codec.c").touch()
    done = subprocess.run([MAKE, "-n", *targets], cwd=tmp_path, capture_output=True, text=True, check=True,
                          env={"PATH": "/nonexistent", "HOME": str(tmp_path)})  # a machine with nothing
    return done.stdout.splitlines()


def test_a_fresh_machine_gets_the_compiler_and_zlib_before_the_codec_is_built(tmp_path: Path) -> None:
    lines = dry_run(tmp_path, "setup")
    install = next(i for i, line in enumerate(lines) if "apt-get install" in line)
    venv = next(i for i, line in enumerate(lines) if "-m venv" in line)
    assert install < venv, lines
    assert "gcc" in lines[install] and "zlib1g-dev" in lines[install], lines[install]


def test_the_test_target_installs_node_and_npm_with_the_other_packages(tmp_path: Path) -> None:
    lines = dry_run(tmp_path, "system-tools")
    [install] = [line for line in lines if "apt-get install" in line]
    for package in ("nodejs", "npm", "libzmq3-dev", "libmsgpuck-dev", "zlib1g-dev", "strace", "chromium"):
        assert f" {package} " in f" {install} ", (package, install)
