"""An engine started by a script dies with it: a SIGKILLed script leaves no process behind.

The script starts an ``EngineProcess`` (which passes ``--die-with-parent``) and
is killed with SIGKILL, so no ``finally`` of its own runs. The kernel's
parent-death signal then reaches the supervisor, which stops its actors in
order: every process of the engine exits, its run directory (ipc sockets) is
removed, and the stop is clean (no ``abort`` marker).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from engine.ipc import endpoints
from supervisor.launcher import EngineProcess
from supervisor.supervisor import FAULTS_FILE
from tests.conftest import processes_mentioning

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """\
import sys
from pathlib import Path
from supervisor.launcher import EngineProcess

engine = EngineProcess(Path(sys.argv[1]))
engine.start()
print("ready", engine.pid, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def test_an_engine_stops_when_the_script_that_started_it_is_killed(tmp_path: Path, store_dir: Path) -> None:
    script = tmp_path / "starts_an_engine.py"
    script.write_text(SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script), str(store_dir)], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline().split()
        assert line[:1] == [b"ready"], f"the script did not start the engine: {line}"
        supervisor = psutil.Process(int(line[1]))
        engine = [supervisor, *supervisor.children(recursive=True)]
        assert len(engine) > 1, "the supervisor runs its actors"
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        _gone, alive = psutil.wait_procs(engine, timeout=60)
        assert alive == [], f"engine processes outlived the script: {[p.pid for p in alive]}"
        assert processes_mentioning(str(store_dir)) == []
        assert not endpoints.run_dir_for(store_dir).exists(), "the supervisor removes its run directory"
        assert not (store_dir / "abort").exists(), "the supervisor stopped its actors cleanly, in order"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)
        parent.stdin.close()  # type: ignore[union-attr]
        parent.stdout.close()  # type: ignore[union-attr]


def test_a_supervisor_whose_parent_is_already_gone_does_not_start(store_dir: Path) -> None:
    """``--die-with-parent PID`` names the parent; if it is not the parent any more, the engine refuses to run."""
    not_the_parent = psutil.Process().ppid()  # alive, but the supervisor's parent is this test process
    done = subprocess.run([sys.executable, "-m", "supervisor", "start", "--store-dir", str(store_dir),
                           "--die-with-parent", str(not_the_parent)], cwd=REPO, capture_output=True, timeout=60,
                          check=False)
    assert done.returncode != 0
    assert b"not starting" in done.stderr, done.stderr
    assert not endpoints.run_dir_for(store_dir).exists()


@pytest.mark.slow  # 4 s
def test_a_supervisor_ended_by_a_fatal_signal_leaves_its_stacks_in_the_logs(store_dir: Path) -> None:
    """Its stderr may be a pipe nobody reads (a script's): the stacks go to logs/supervisor.faults."""
    engine = EngineProcess(store_dir)
    engine.start()
    try:
        actors = [psutil.Process(pid) for pid in engine.actor_pids().values()]
        os.kill(engine.pid, signal.SIGSEGV)
        _gone, orphans = psutil.wait_procs(actors, timeout=30)
        assert orphans == [], "the actors stop with their supervisor"
        assert engine.process is not None and engine.process.wait(10) == -signal.SIGSEGV
        engine.process = None
        faults = (store_dir / "logs" / FAULTS_FILE).read_text()
        engine.start()  # the next start recovers, as after any crash (and removes the run directory)
        # its stacks: the main thread was in the supervisor's loop, or still printing that it is ready
        assert "Segmentation fault" in faults and f"supervisor{os.sep}" in faults, faults
    finally:
        engine.stop()
