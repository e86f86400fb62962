"""The console scripts as pip installs them (rmqpy, rmqpy-server): help with examples, completion,
and a round trip against a live engine.

The scripts are the ones in the virtualenv's bin directory, beside the interpreter that runs
the tests (``pip install -e .`` puts them there); every command's ``--help`` is run as a user
runs it, through both the console script and ``python -m``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import cli
from supervisor import __main__ as server_cli
from supervisor.launcher import EngineProcess
from tests.helpers import wait_dispatched

pytestmark = pytest.mark.timeout(120)

BIN = Path(sys.executable).parent
# console script -> (module of ``python -m``, its parser)
PROGRAMS = {"rmqpy": ("engine", cli.build_parser()), "rmqpy-server": ("supervisor", server_cli.build_parser())}


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


COMMANDS = [(script, name) for script, (_module, parser) in PROGRAMS.items() for name in subcommands(parser)]


def run(command: list[str], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, env=env)


def examples(help_text: str) -> list[str]:
    """The command lines under "examples:" in a --help output."""
    assert "\nexamples:\n" in help_text, help_text
    block = help_text.split("\nexamples:\n", 1)[1].split("\n\n", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


@pytest.mark.parametrize("script", sorted(PROGRAMS))
def test_the_console_scripts_are_installed_and_show_examples(script: str) -> None:
    assert (BIN / script).is_file(), f"{script} is not in {BIN}: run pip install -e ."
    shown = run([str(BIN / script), "--help"])
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"usage: {script} ")
    assert all(line.startswith(f"{script} ") for line in examples(shown.stdout))


@pytest.mark.parametrize(("script", "command"), COMMANDS)
def test_every_command_help_exits_0_and_shows_examples_of_itself(script: str, command: str) -> None:
    module, _parser = PROGRAMS[script]
    for prog, argv in ((script, [str(BIN / script)]), (f"python -m {module}", [sys.executable, "-m", module])):
        shown = run([*argv, command, "--help"])
        assert shown.returncode == 0, shown.stderr
        lines = examples(shown.stdout)
        assert len(lines) >= 2, shown.stdout
        assert all(line.startswith(f"{prog} {command}") for line in lines), lines


@pytest.mark.parametrize(("script", "command"), COMMANDS)
def test_every_option_says_what_it_does(script: str, command: str) -> None:
    parser = subcommands(PROGRAMS[script][1])[command]
    silent = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
    assert silent == [], f"{script} {command}: options without help: {silent}"


def complete(script: str, line: str) -> list[str]:
    """What bash would offer after ``eval "$(register-python-argcomplete SCRIPT)"`` for ``line``."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"completion-{os.getpid()}-{script}"
    env = {**os.environ, "_ARGCOMPLETE": "1", "_ARGCOMPLETE_SHELL": "bash", "COMP_LINE": line,
           "COMP_POINT": str(len(line)), "_ARGCOMPLETE_IFS": "\n", "_ARGCOMPLETE_STDOUT_FILENAME": str(out)}
    try:
        done = run([str(BIN / script)], env=env)
        assert done.returncode == 0, done.stderr
        return [word.strip() for word in out.read_text().split("\n")]  # a lone match ends with a space
    finally:
        out.unlink(missing_ok=True)


def test_completion_offers_commands_and_options() -> None:
    assert set(complete("rmqpy", "rmqpy ")) >= {"produce", "consume", "query", "check", "transaction"}
    assert complete("rmqpy", "rmqpy pro") == ["produce"]
    assert complete("rmqpy", "rmqpy produce --to") == ["--topic"]
    assert set(complete("rmqpy-server", "rmqpy-server st")) == {"start", "status", "stop"}
    assert complete("rmqpy-server", "rmqpy-server start --de") == ["--detach"]
    registration = run([str(BIN / "register-python-argcomplete"), "rmqpy"])
    assert registration.returncode == 0 and "complete" in registration.stdout


def test_messages_go_round_trip_through_the_console_scripts(engine: EngineProcess) -> None:
    rmqpy, ep = str(BIN / "rmqpy"), ["--endpoint", engine.endpoint]
    sent = run([rmqpy, "produce", *ep, "--topic", "scripts", "--count", "30", "--batch-size", "10", "--keys",
                "--body", "via the console script", "--json"])
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["sent"] == 30
    with engine.client() as client:
        wait_dispatched(client)
    got = run([rmqpy, "consume", *ep, "--topic", "scripts", "--count", "100", "--json"])
    assert got.returncode == 0, got.stderr
    messages = json.loads(got.stdout)
    assert sorted(m["keys"][0] for m in messages) == sorted(f"key-{i}" for i in range(30))
    assert {m["body"] for m in messages} == {"via the console script"}
    status = run([str(BIN / "rmqpy-server"), "status", "--store-dir", str(engine.store_dir), "--json"])
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "RUNNING"
