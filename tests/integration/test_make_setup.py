"""The Makefile's set-up on a fresh machine: what it installs, and in which order.

``make -n`` prints the recipe without running it, so these tests read what a fresh clone would
do (no virtualenv, no stamps) without installing anything. The machine is played by ``PATH``
(a folder holding only the commands it "has") and ``INCLUDE_DIR`` (where it has headers).
Debian packages are asked for one group per ``apt-get install``, and only what is missing:
on a machine whose Node.js comes from NodeSource (its ``nodejs`` bundles npm and conflicts with
Debian's ``npm``), one transaction asking for both was refused whole, and Chromium, libzmq,
msgpuck and bindfs never came.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make") or "/usr/bin/make"


def dry_run(tmp_path: Path, *targets: str, has: tuple[str, ...] = (), root: bool = True) -> list[str]:
    """``make -n targets`` on a machine with only the commands ``has`` (and, as root, apt-get)."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    for name in ("pyproject.toml", "setup.py"):
        (tmp_path / name).touch()
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "_codec.c").touch()
    bin_dir, include_dir = tmp_path / "bin", tmp_path / "include"
    bin_dir.mkdir()
    include_dir.mkdir()
    uid = "0" if root else "1000"
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    for command in ("apt-get", *has):
        (bin_dir / command).write_text("#!/bin/sh\n")
    for command in bin_dir.iterdir():
        command.chmod(0o755)
    done = subprocess.run([MAKE, "-n", *targets, f"INCLUDE_DIR={include_dir}"], cwd=tmp_path, capture_output=True,
                          text=True, check=True, env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    return done.stdout.splitlines()


def installs(lines: list[str]) -> list[set[str]]:
    """The packages of each ``apt-get install`` call, in order."""
    calls = []
    for line in lines:
        if "apt-get install" in line and "DEBIAN_FRONTEND" in line:  # not a note that names the command
            words = line.split("apt-get install", 1)[1].split(">", 1)[0].split()
            calls.append({word for word in words if not word.startswith("-")})
    return calls


def test_a_fresh_machine_gets_the_compiler_and_zlib_before_the_codec_is_built(tmp_path: Path) -> None:
    lines = dry_run(tmp_path, "setup")
    install = next(i for i, line in enumerate(lines) if "DEBIAN_FRONTEND" in line)
    venv = next(i for i, line in enumerate(lines) if "-m venv" in line)
    assert install < venv, lines
    assert {"gcc", "libc6-dev", "zlib1g-dev"} <= installs(lines)[0], lines[install]


def test_each_group_of_packages_is_asked_for_on_its_own_and_npm_apart_from_nodejs(tmp_path: Path) -> None:
    lines = dry_run(tmp_path, "system-tools")
    calls = installs(lines)
    assert sum("apt-get update" in line for line in lines) == 1, lines
    wanted = {"nodejs", "npm", "libzmq3-dev", "libmsgpuck-dev", "zlib1g-dev", "strace", "chromium", "chromium-driver",
              "bindfs", "fuse3", "etcd-server", "prometheus"}
    assert wanted <= set().union(*calls), calls
    assert len(calls) >= 9, calls  # build, C client, nodejs, npm, strace, browser, FUSE, etcd, prometheus
    assert {"npm"} in calls and not any("npm" in call and len(call) > 1 for call in calls), calls
    npm_line = next(line for line in lines if "DEBIAN_FRONTEND" in line and installs([line]) == [{"npm"}])
    assert "command -v npm" in npm_line, "npm is asked for only if nodejs did not bring it"


def test_a_machine_with_node_and_npm_from_nodesource_is_asked_for_neither(tmp_path: Path) -> None:
    calls = installs(dry_run(tmp_path, "system-tools", has=("node", "npm")))
    asked = set().union(*calls)
    assert "nodejs" not in asked and "npm" not in asked, calls
    assert {"libzmq3-dev", "chromium", "bindfs", "etcd-server"} <= asked, calls


def test_a_machine_that_has_everything_is_asked_for_nothing(tmp_path: Path) -> None:
    commands = ("cc", "make", "pkg-config", "node", "npm", "strace", "chromium", "chromedriver", "bindfs",
                "fusermount3", "etcd", "promtool", "ip", "nft", "faketime")
    lines = dry_run(tmp_path, "system-tools", has=commands)
    asked = set().union(*installs(lines))
    assert asked == {"libc6-dev", "zlib1g-dev", "libzmq3-dev", "libmsgpuck-dev"}, asked  # the headers only


def test_without_root_what_is_missing_is_named_and_nothing_installed(tmp_path: Path) -> None:
    lines = dry_run(tmp_path, "system-tools", root=False)
    assert not installs(lines), lines
    assert any("note: missing" in line and "libzmq3-dev" in line for line in lines), lines
