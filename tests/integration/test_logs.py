"""The engine's logs: one file per process in STORE/logs, text or JSON lines, rotated by size.

An engine runs with ``log_format = "json"`` and a tiny rotation size; an actor is killed with
SIGKILL; then every log line must be a JSON object with the documented keys, the supervisor's
log must tell the kill, the restart and the recovery as events, and no log may keep more than
``log_files_kept`` files.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import ConfigError, StoreConfig
from engine.ipc.control import EventStream
from engine.logs import LOG_DIR
from harness.faults import kill_actor
from supervisor.launcher import EngineProcess, write_config
from supervisor.processes import rotate_if_full as _rotate_if_full

pytestmark = pytest.mark.timeout(120)

KEPT = 3


def log_files(log_dir: Path) -> dict[str, list[Path]]:
    """Log name -> its files, the live one first (writer -> writer.log, writer.log.1, ...)."""
    names: dict[str, list[Path]] = {}
    for path in sorted(log_dir.glob("*.log*")):
        names.setdefault(path.name.split(".log")[0], []).append(path)
    return names


def json_lines(paths: list[Path]) -> list[dict[str, object]]:
    lines = []
    for path in paths:
        for text in path.read_text().splitlines():
            line = json.loads(text)
            assert isinstance(line, dict), text
            lines.append(line)
    return lines


def test_json_logs_tell_a_kill_and_its_restart_and_rotate(store_dir: Path) -> None:
    config = StoreConfig.test_min().replace(log_format="json", log_file_bytes_max=4096, log_files_kept=KEPT)
    engine = EngineProcess(store_dir, config=config)
    engine.start()
    try:
        events = EventStream(store_dir)
        killed = []
        for role in ("writer", "index", "front"):
            name, pid = kill_actor(store_dir, role)
            events.wait_for("actor.exited", name=name)
            events.wait_for("recovery.done", name=name)
            killed.append((name, pid))
        events.close()
    finally:
        assert engine.stop() == 0
    files = log_files(store_dir / LOG_DIR)
    assert {"supervisor", "writer", "flusher", "reput", "front"} <= files.keys()
    for name, paths in files.items():
        assert len(paths) <= KEPT, f"{name}: {[p.name for p in paths]}"
        for line in json_lines(paths):
            assert {"ts", "level", "actor", "pid", "logger", "message"} <= line.keys(), line
            assert line["actor"] == name and line["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
            assert datetime.datetime.fromisoformat(str(line["ts"])).tzinfo is not None
    assert len(files["supervisor"]) == KEPT, "4 KiB of supervisor log rotates within one start and stop"
    supervisor = json_lines(files["supervisor"][::-1])  # oldest file first
    for name, pid in killed:
        exited = [e for e in supervisor if e.get("event") == "actor.exited" and e["actor_pid"] == pid]
        assert [(e["actor_name"], e["exit_code"], e["signal"], e["level"]) for e in exited] == \
            [(name, -9, "SIGKILL", "WARNING")]
        assert exited[0]["message"] == f"actor {name} (pid {pid}) was killed by SIGKILL"
        restarted = [e for e in supervisor if e.get("event") == "actor.restarted" and e["actor_name"] == name]
        assert len(restarted) == 1 and restarted[0]["actor_pid"] != pid
        recovered = [e for e in supervisor if e.get("event") == "recovery.done"
                     and e["actor_pid"] == restarted[0]["actor_pid"]]
        assert len(recovered) == 1 and isinstance(recovered[0]["duration_ms"], int)
    assert supervisor[-1]["event"] == "engine.stopped" and supervisor[-1]["clean"] is True
    assert (store_dir / LOG_DIR / "writer.stderr").exists(), "raw stderr is kept apart from the log"


def test_text_logs_by_default(engine: EngineProcess, store_dir: Path) -> None:
    engine.stop()
    supervisor = (store_dir / LOG_DIR / "supervisor.log").read_text()
    assert " supervisor[" in supervisor and "INFO actor writer started (pid " in supervisor
    assert "INFO engine stopped cleanly" in supervisor.splitlines()[-1]
    writer = (store_dir / LOG_DIR / "writer.log").read_text()
    assert " writer[" in writer and " INFO recovered: log end " in writer
    assert not writer.lstrip().startswith("{")


CRASH = """
import logging, sys
from pathlib import Path
from engine.logs import configure_logging
from engine.config import StoreConfig
configure_logging("crasher", Path(sys.argv[1]), StoreConfig.test_min().replace(log_format="json"))
logging.getLogger("engine.test").warning("about to fail")
raise ValueError("boom")
"""


def test_an_uncaught_exception_is_logged_and_its_traceback_kept_on_stderr(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", CRASH, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 1
    assert "ValueError: boom" in done.stderr, "Python's own report still reaches stderr"
    warning, crash = json_lines([tmp_path / "crasher.log"])
    assert (warning["level"], warning["logger"], warning["message"]) == ("WARNING", "engine.test", "about to fail")
    assert (crash["level"], crash["event"], crash["message"]) == \
        ("CRITICAL", "process.crashed", "uncaught ValueError; the process exits")
    assert str(crash["exception"]).startswith("Traceback") and "ValueError: boom" in str(crash["exception"])


def test_log_settings_are_validated(tmp_path: Path) -> None:
    for bad, message in (({"log_format": "xml"}, "log_format"), ({"log_file_bytes_max": 100}, "log_file_bytes_max"),
                         ({"log_files_kept": 1}, "log_files_kept")):
        with pytest.raises(ConfigError, match=message):
            StoreConfig.test_min().replace(**bad)
    path = tmp_path / "engine.toml"
    path.write_text('log_format = "JSON"\n')
    with pytest.raises(ConfigError, match="log_format"):
        StoreConfig.load(path)
    written = write_config(tmp_path / "json.toml", StoreConfig.test_min().replace(log_format="json"))
    assert StoreConfig.load(written).log_format == "json"


def test_raw_stderr_files_rotate_like_the_logs(tmp_path: Path) -> None:
    path = tmp_path / "writer.stderr"
    for generation in range(5):
        path.write_bytes(b"%d" % generation * 5000)
        _rotate_if_full(path, 4096, KEPT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["writer.stderr.1", "writer.stderr.2"]
    assert (tmp_path / "writer.stderr.1").read_bytes()[:1] == b"4"
    assert (tmp_path / "writer.stderr.2").read_bytes()[:1] == b"3"
    path.write_bytes(b"small")
    _rotate_if_full(path, 4096, KEPT)
    assert path.read_bytes() == b"small", "a file under the size stays"
