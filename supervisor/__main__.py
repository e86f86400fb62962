# PYTHON_ARGCOMPLETE_OK (argcomplete's global completion looks for this line)
"""``rmqpy-server`` and ``python -m supervisor start|stop|status``: run and manage the engine.

    python -m supervisor start [--store-dir DIR] [--endpoint URL] [--config FILE] [--detach | --die-with-parent PID]
    python -m supervisor stop [--store-dir DIR]
    python -m supervisor status [--store-dir DIR] [--json]

``start`` runs in the foreground and prints ``ready <endpoint>`` once every
actor serves; Ctrl-C (SIGINT) or SIGTERM stops it cleanly, in order.
``--die-with-parent PID`` (for scripts and tests, which pass their own pid)
makes that stop happen when the process that started the engine dies, even by
SIGKILL: see ``_die_with_parent``.

Log lines go to ``STORE/logs/supervisor.log`` (and, in the foreground, to stderr);
each actor writes its own ``STORE/logs/<name>.log`` (``engine/actors/base.py``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import argcomplete
import psutil

from engine.config import ConfigError, StoreConfig
from engine.ipc.curve import check_authorized_keys_dir, load_server_keys, secret_keys_in
from engine.ipc.messages import StatusQuery, StopCommand
from supervisor.control import ControlTimeout, NotRunning, control, supervisor_state
from supervisor.supervisor import LOG_DIR, EngineError, Supervisor

DEFAULT_STORE_DIR = Path("store")


def _add_store(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store-dir", type=Path, default=DEFAULT_STORE_DIR, metavar="DIR",
                        help="the store directory (default: ./store)")


_HELP = argparse.RawDescriptionHelpFormatter

# The examples under each command's --help (%(prog)s is how it was run: "rmqpy-server start" or
# "python -m supervisor start").
_EXAMPLES = {
    "": """examples:
  %(prog)s start --store-dir /var/lib/rmqpy --config /etc/rmqpy/engine.toml
  %(prog)s status --store-dir /var/lib/rmqpy
  %(prog)s stop --store-dir /var/lib/rmqpy

Shell completion (bash): eval "$(register-python-argcomplete rmqpy-server)"

Logs: STORE/logs/<actor>.log and supervisor.log (rotated; log_format, log_file_bytes_max and
log_files_kept in the config file), raw stderr of each process in STORE/logs/<actor>.stderr.""",
    "start": """examples:
  %(prog)s                                          # ./store on tcp://127.0.0.1:10911; Ctrl-C stops it
  %(prog)s --store-dir /var/lib/rmqpy --config /etc/rmqpy/engine.toml --detach
  %(prog)s --endpoint tcp://127.0.0.1:10912 --store-dir /tmp/second-store

Prints "ready <endpoint> store=<dir>" once every actor serves. In the foreground, log lines
also go to stderr; SIGINT or SIGTERM stops the actors in order (exit status 0).""",
    "stop": """examples:
  %(prog)s
  %(prog)s --store-dir /var/lib/rmqpy

Waits up to 60 s for the supervisor to exit; exit status 1 if no engine runs there.""",
    "status": """examples:
  %(prog)s --store-dir /var/lib/rmqpy
  %(prog)s --store-dir /var/lib/rmqpy --json

Exit status: 0 running (RUNNING or DEGRADED), 3 no engine on the store.""",
}


def build_parser(prog: str = "python -m supervisor") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Run the message store engine: start its actors, "
                                     "watch and restart them, stop them in order.", epilog=_EXAMPLES[""],
                                     formatter_class=_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    start = _command(commands, "start", "start the engine (foreground unless --detach)")
    _add_store(start)
    start.add_argument("--endpoint", metavar="URL", help="client endpoint (default tcp://127.0.0.1:10911, or the "
                                                         "config file's endpoint)")
    start.add_argument("--config", type=Path, metavar="FILE", help="TOML file of settings (see docs/configuration.md)")
    mode = start.add_mutually_exclusive_group()
    mode.add_argument("--detach", action="store_true", help="run in the background; return once ready")
    mode.add_argument("--die-with-parent", type=int, metavar="PID",
                      help="stop cleanly when process PID, which started this one, exits (for scripts)")
    # The background supervisor that --detach starts: its stderr is a file, so it logs to its log only.
    start.add_argument("--detached-child", action="store_true", help=argparse.SUPPRESS)
    stop = _command(commands, "stop", "stop the engine running on a store directory")
    _add_store(stop)
    status = _command(commands, "status", "actors, pids, states and offsets")
    _add_store(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _command(commands: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text,
                                                          epilog=_EXAMPLES[name], formatter_class=_HELP)
    return parser


def _store_port(endpoint: str | None) -> int | None:
    if endpoint and endpoint.startswith("tcp://") and endpoint.rsplit(":", 1)[-1].isdigit():
        return int(endpoint.rsplit(":", 1)[-1])
    return None


def cmd_start(args: argparse.Namespace) -> int:
    config = StoreConfig.load(args.config, endpoint=args.endpoint, store_port=_store_port(args.endpoint))
    if config.curve_enabled:  # fail here, with the reason, rather than in the front's restarts
        try:
            load_server_keys(config.curve_server_secret_key_file)
            allowed = check_authorized_keys_dir(config.curve_authorized_keys_dir)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not allowed:
            print(f"warning: {config.curve_authorized_keys_dir} holds no client key (*.key): nobody can connect",
                  file=sys.stderr)
        if secrets := secret_keys_in(config.curve_authorized_keys_dir):
            print(f"warning: {config.curve_authorized_keys_dir} holds secret keys ({', '.join(secrets)}); only "
                  "public *.key files are read there: keep each .key_secret with its client", file=sys.stderr)
    if args.detach:
        return _start_detached(args, config)
    # Until the supervisor holds the store's lock and opens logs/supervisor.log (Supervisor.start).
    logging.basicConfig(level=logging.INFO, format="%(asctime)s supervisor %(levelname)s %(message)s")
    supervisor = Supervisor(args.store_dir, config, parent_pid=args.die_with_parent,
                            log_stderr=not args.detached_child)
    signal.signal(signal.SIGINT, lambda *_: supervisor.request_stop())
    signal.signal(signal.SIGTERM, lambda *_: supervisor.request_stop())
    if args.die_with_parent is not None and not _die_with_parent(args.die_with_parent):
        print(f"error: process {args.die_with_parent}, which started the engine, is not its parent any more "
              f"(it exited); not starting", file=sys.stderr)
        return 1
    supervisor.start()
    print(f"ready {config.endpoint} store={supervisor.store_dir}", flush=True)
    try:
        supervisor.run()
    finally:
        clean = supervisor.shutdown()
    try:
        print("stopped" if clean else "stopped (not cleanly; the next start recovers)", flush=True)
    except BrokenPipeError:  # the process reading our output is gone (--die-with-parent)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> bool:
    """Have the kernel send SIGTERM when the parent dies; False if it already has.

    SIGTERM takes the same path as ``stop``: the actors stop in order and the
    run directory is removed. The kernel's "parent" is the *thread* that forked
    this process, so the launcher asks for this only from its main thread
    (``EngineProcess``). The parent may die before the ``prctl``: then our
    parent is no longer ``parent_pid`` and we do not start. The supervisor's
    loop also compares ``getppid()`` with ``parent_pid`` (``Supervisor.run``).
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    except OSError as exc:
        logging.getLogger("supervisor").warning("%s; relying on parent pid checks", exc)
    return os.getppid() == parent_pid


def _start_detached(args: argparse.Namespace, config: StoreConfig) -> int:
    store_dir = args.store_dir.resolve()
    store_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "supervisor", "start", "--store-dir", str(store_dir), "--detached-child"]
    if args.endpoint:
        command += ["--endpoint", args.endpoint]
    if args.config:
        command += ["--config", str(args.config.resolve())]
    (store_dir / LOG_DIR).mkdir(exist_ok=True)
    log_path = store_dir / LOG_DIR / "supervisor.log"  # written by the child; its raw stderr beside it
    with open(store_dir / LOG_DIR / "supervisor.stderr", "ab") as log_file:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                 start_new_session=True)
    deadline = time.monotonic() + config.actor_start_timeout_ms / 1000 * 2
    while time.monotonic() < deadline:
        if child.poll() is not None:
            print(f"the engine failed to start; see {log_path} and {log_path.with_suffix('.stderr')}",
                  file=sys.stderr)
            return 1
        try:
            reply = control(store_dir, StatusQuery(), timeout_ms=500)
        except (NotRunning, ControlTimeout):
            time.sleep(0.05)  # waiting on another process to appear; no event to wait on yet
            continue
        if reply.state == "RUNNING":
            print(f"ready {config.endpoint} store={store_dir} pid={child.pid}", flush=True)
            return 0
    print(f"the engine did not become ready; see {log_path} and {log_path.with_suffix('.stderr')}",
          file=sys.stderr)
    return 1


def cmd_stop(args: argparse.Namespace) -> int:
    try:
        pid = supervisor_state(args.store_dir)["pid"]
        assert isinstance(pid, int), pid  # written as os.getpid()
        control(args.store_dir, StopCommand())
    except NotRunning as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        psutil.Process(pid).wait(timeout=60)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        print(f"the supervisor (pid {pid}) did not exit within 60 s", file=sys.stderr)
        return 1
    print("stopped")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    try:
        reply = control(args.store_dir, StatusQuery())
    except NotRunning as exc:
        print(json.dumps({"state": "STOPPED"}) if args.json else exc)
        return 3
    offsets = reply.offsets
    if args.json:
        print(json.dumps({"state": reply.state, "endpoint": reply.endpoint, "offsets": offsets,
                          "actors": [{"name": a.name, "pid": a.pid, "state": a.lifecycle, "restarts": a.restarts,
                                      **a.detail} for a in reply.actors]}, indent=2))
        return 0
    print(f"engine {reply.state} on {reply.endpoint}")
    print(f"{'actor':<10} {'pid':>8} {'state':<10} {'restarts':>8}  detail")
    for a in reply.actors:
        detail = " ".join(f"{k}={v}" for k, v in a.detail.items())
        print(f"{a.name:<10} {a.pid:>8} {a.lifecycle:<10} {a.restarts:>8}  {detail}")
    print("offsets: " + " ".join(f"{k}={v}" for k, v in offsets.items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``rmqpy-server`` and ``python -m supervisor``."""
    parser = build_parser("rmqpy-server" if Path(sys.argv[0]).name == "rmqpy-server" else "python -m supervisor")
    argcomplete.autocomplete(parser)  # answers a completing shell and exits; otherwise does nothing
    args = parser.parse_args(argv)
    try:
        return {"start": cmd_start, "stop": cmd_stop, "status": cmd_status}[args.command](args)
    except (ConfigError, EngineError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
