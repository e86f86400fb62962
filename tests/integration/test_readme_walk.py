"""The README's command blocks, walked in order against a live engine, as a new user would.

Each ```sh block of README.md is run line by line (a here-document goes with its line) in
a scratch directory, with the virtualenv's ``python`` first on PATH, on the default
endpoint and ports the README names. Every command must exit 0, and where the README says
what a command prints or does, ``CLAIMS`` checks it. The Python blocks are run where they
stand too (``<!-- run: ... -->``; ``tests/client/test_docs_programs.py`` holds their output).

Blocks marked ``<!-- walk: skip, REASON -->`` are not run here: the set-up commands (this
test is part of what they run) and the official clients' examples (run by
``tests/grpc/test_official_conformance.py``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # a minute: CI runs it in its slow step

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PORTS = {10911: "endpoint", 9108: "metrics_endpoint", 8081: "grpc_endpoint"}

# What the README says a command prints: (a piece of the command, a pattern its output must match).
CLAIMS = [
    ("supervisor start --detach", r"ready tcp://127\.0\.0\.1:10911"),
    ("topics --create orders", r"orders"),
    ("produce --topic orders --count 10000", r"sent 10000 messages"),
    ("consume --topic orders --queue-id 0 --count 5", r"5 messages"),
    ("query --topic orders --key key-42", r"key-42"),
    ("query --id 7F00000100002A9F0000000000000000", r"orders"),
    ("supervisor status", r"RUNNING"),
    ("--subscription \"paid || refunded\"", r"paid"),
    ("stats --topic orders --group billing", r"billing"),
    ("topics --delete orders", r"orders"),
    ("--pop --ack --count 500", r"500 messages"),
    ("--delay-ms 30000", r"due "),
    ("--transaction", r"transaction --commit"),
    ("transaction --commit", r"commit"),
    ("supervisor stop", r"^stopped$"),
    ("engine inspect", r"^segments:"),
    ("engine check", r"no problems found"),
    ("supervisor start --config engine.toml --detach", r"ready tcp://127\.0\.0\.1:10911"),
    ("--server-key keys/server.key", r"orders|jobs"),
    ("supervisor start --config grpc.toml --detach", r"ready tcp://127\.0\.0\.1:10911"),
    ("curl -s 127.0.0.1:9108/healthz", r"^RUNNING"),
    ("curl -s 127.0.0.1:9108/metrics",
     r"^rmqpy_group_lag_messages\{group=\"billing\".*\n(.*\n)*rmqpy_actor_restarts_total"),
]
# What a healthy run must not print.
REFUTED = [("engine inspect", r"DAMAGE"), ("engine check", r"DAMAGE")]
# The README's placeholder for "the id the command before printed"; the walk puts the real one in.
PLACEHOLDER_ID = "7F00000100002A9F00000000000A1B2C"


@dataclass
class Block:
    kind: str  # "sh" or "python"
    marker: str  # the <!-- ... --> line just above it, if any
    text: str
    line: int


def readme_blocks() -> list[Block]:
    blocks, lines = [], (ROOT / "README.md").read_text().splitlines()
    i = 0
    while i < len(lines):
        match = re.fullmatch(r"```(sh|python)", lines[i])
        if match is None:
            i += 1
            continue
        end = lines.index("```", i + 1)
        marker = lines[i - 1] if i and lines[i - 1].startswith("<!--") else ""
        blocks.append(Block(match.group(1), marker, "\n".join(lines[i + 1:end]), i + 1))
        i = end + 1
    return blocks


def commands(block: Block) -> list[str]:
    """The block's commands: a line each, a here-document with its line, shell prompts ("$ ") taken off."""
    found: list[str] = []
    lines = iter(block.text.splitlines())
    for line in lines:
        command = line
        if block.text.lstrip().startswith("$ "):
            if not line.startswith("$ "):
                continue  # the output the README shows under a prompt
            command = line[2:]
        heredoc = re.search(r"<<'?(\w+)'?", command)
        if heredoc:
            body = []
            for more in lines:
                body.append(more)
                if more == heredoc.group(1):
                    break
            command = "\n".join([command, *body])
        found.append(command)
    return found


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    taken = [f"{port} ({name})" for port, name in DEFAULT_PORTS.items() if port_taken(port)]
    assert not taken, f"the README's default ports are in use here: {taken}; stop what listens there"
    yield tmp_path
    # Whatever the walk left running (a failed step): stopped as the README says, then by signal.
    env = walk_env(tmp_path)
    subprocess.run([sys.executable, "-m", "supervisor", "stop"], cwd=tmp_path, env=env, capture_output=True,
                   timeout=90, check=False)
    state = tmp_path / "store" / "lock"
    if state.exists():
        pid = state.read_text().strip()
        if pid.isdigit():
            try:
                os.kill(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass


def walk_env(cwd: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)  # the examples' imports and `python -m engine` from the scratch directory
    return env


def run(command: str, cwd: Path) -> str:
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=walk_env(cwd),
                          capture_output=True, text=True, timeout=120, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"README command failed ({done.returncode}):\n$ {command}\n{output}"
    return output


def test_every_readme_command_does_what_the_readme_says(scratch: Path) -> None:
    shutil.copytree(ROOT / "examples", scratch / "examples", ignore=shutil.ignore_patterns("node_modules"))
    walked, last_id = [], ""
    for block in readme_blocks():
        if "walk: skip" in block.marker:
            continue
        if block.kind == "python":
            if block.marker.startswith("<!-- run:"):
                (scratch / "block.py").write_text(block.text)
                walked.append(f"python block at line {block.line}")
                run(f"{sys.executable} block.py", scratch)
            continue
        for written in commands(block):
            command = written.replace(PLACEHOLDER_ID, last_id) if PLACEHOLDER_ID in written else written
            assert last_id or PLACEHOLDER_ID not in written, f"no id printed before line {block.line}: {written}"
            output = run(command, scratch)
            walked.append(command)
            for piece, pattern in CLAIMS:
                if piece in command:
                    assert re.search(pattern, output, re.MULTILINE), \
                        f"README line {block.line}: `{command}` should print {pattern!r}; it printed:\n{output}"
            for piece, pattern in REFUTED:
                if piece in command:
                    assert not re.search(pattern, output), f"README line {block.line}: `{command}`:\n{output}"
            printed = re.search(r"transaction --commit ([0-9A-F]{32,56})", output)
            if printed:
                last_id = printed.group(1)
    claimed = [piece for piece, _ in CLAIMS if not any(piece in command for command in walked)]
    assert not claimed, f"claims about commands the README no longer has: {claimed}"
    assert "supervisor stop" in walked[-1] or any("supervisor stop" in c for c in walked)
