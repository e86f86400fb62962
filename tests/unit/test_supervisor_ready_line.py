"""The supervisor's "ready" line: one write, and a reader gone already is no reason to stop.

A script that starts an engine may act on the line at once, even be killed; the supervisor
then still runs, and stops in order when told (tests/crash/test_script_death.py)."""

from __future__ import annotations

import os
import sys

import pytest

from supervisor.__main__ import _say

pytestmark = pytest.mark.timeout(10)


def test_the_ready_line_goes_out_whole_and_a_closed_pipe_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    read_end, write_end = os.pipe()
    out = os.fdopen(write_end, "w", buffering=1)
    monkeypatch.setattr(sys, "stdout", out)
    try:
        _say("ready tcp://127.0.0.1:1 store=here\n")
        assert os.read(read_end, 100) == b"ready tcp://127.0.0.1:1 store=here\n"  # in one piece
        os.close(read_end)  # whoever waited for it is gone
        _say("stopped\n")  # no BrokenPipeError: the rest of the output goes nowhere
        _say("stopped again\n")
    finally:
        monkeypatch.undo()
        out.close()
