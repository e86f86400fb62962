"""The README's CURVE recipe, run as written (in a temporary directory): no secret key ever
lands in the folder the engine reads its allowed clients from, and the client it sets up
gets in."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import StoreConfig
from supervisor.launcher import EngineProcess

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(90)


def recipe() -> list[str]:
    """The shell lines of the README's block that sets up CURVE."""
    text = (ROOT / "README.md").read_text()
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "curve_enabled = true" in b]
    assert len(blocks) == 1, "the README has one CURVE recipe"
    return blocks[0].splitlines()


def run_shell(lines: list[str], cwd: Path) -> None:
    script = "\n".join(lines).replace("python -m", f"{shlex.quote(sys.executable)} -m")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_readme_curve_recipe_gives_the_engine_no_secret_key_and_lets_the_client_in(tmp_path: Path) -> None:
    lines = recipe()
    [start] = [i for i, line in enumerate(lines) if line.startswith("python -m supervisor start")]
    [client_line] = [line for line in lines[start + 1:] if line.startswith("python -m engine ")]
    run_shell(lines[:start], tmp_path)  # the keys and the config file; the engine is started below
    config = StoreConfig.load(tmp_path / "engine.toml")
    allowed = Path(config.curve_authorized_keys_dir)
    assert allowed.is_dir()
    assert sorted(p.name for p in allowed.iterdir()) == ["billing.key"]  # the public key only
    assert "secret-key" not in (allowed / "billing.key").read_text()
    server_secret = Path(config.curve_server_secret_key_file)
    assert server_secret.parent != allowed
    engine = EngineProcess(tmp_path / "store", config=StoreConfig.test_min().replace(
        curve_enabled=True, curve_server_secret_key_file=str(server_secret), curve_authorized_keys_dir=str(allowed)))
    engine.start()
    try:  # the README's client command, at this engine's endpoint
        run_shell([client_line.split("#")[0].strip() + f" --endpoint {engine.endpoint}"], tmp_path)
    finally:
        engine.stop()
