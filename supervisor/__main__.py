# PYTHON_ARGCOMPLETE_OK (argcomplete's global completion looks for this line)
"""``rmqpy-server`` and ``python -m supervisor start|stop|status``: run and manage the engine.

    python -m supervisor start [--store-dir DIR] [--endpoint URL] [--config FILE] [--detach | --die-with-parent PID]
    python -m supervisor stop [--store-dir DIR | --endpoint URL]
    python -m supervisor status [--store-dir DIR | --endpoint URL] [--json]

``start`` runs in the foreground and prints ``ready <endpoint>`` once every
actor serves; Ctrl-C (SIGINT) or SIGTERM stops it cleanly, in order.
``--die-with-parent PID`` (for scripts and tests, which pass their own pid)
makes that stop happen when the process that started the engine dies, even by
SIGKILL: see ``_die_with_parent``.

Every path ends in an exit status of the table below (``EXIT_*``; docs/operations.md
1.1) and, for a failure, one line on stderr, never a traceback.

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
from engine.ipc.control import ControlTimeout, NotRunning, control, find_engine, supervisor_state
from engine.ipc.messages import ActorStatus, StatusQuery, StopCommand
from engine.version import package_version
from supervisor.cluster import add_cluster_parser, cmd_cluster
from supervisor.start_checks import EngineError, StoreHeld, check_ports, check_store_free, last_line
from supervisor.supervisor import ABORT_FILE, LOG_DIR, Supervisor, degraded_note

DEFAULT_STORE_DIR = Path("store")

# Exit statuses: docs/operations.md 1.1 ("exit codes of rmqpy-server") and every --help.
EXIT_OK = 0
EXIT_FAILED = 1  # the start failed: a port in use, a store it cannot write, an actor that did not start
EXIT_USAGE = 2  # a bad command line or setting (argparse's own status for a bad command line)
EXIT_NOT_RUNNING = 3  # status, stop: no engine is running there
EXIT_HELD = 4  # start: another engine holds the store
EXIT_UNCLEAN = 5  # the engine stopped, but not cleanly (the abort marker stays; the next start recovers)
EXIT_NO_ANSWER = 6  # status, stop: the supervisor runs but did not answer, or did not exit in time

_EXIT_TABLE = """exit status:
  0  done: started and ready; stopped cleanly; status RUNNING or DEGRADED
  1  the start failed (a port in use, a store directory it cannot write, an actor that did not start)
  2  a bad command line or setting
  3  no engine is running there (status, stop)
  4  another engine holds the store (start)
  5  the engine stopped, but not cleanly; the next start recovers (stop; start, after its stop)
  6  the supervisor did not answer, or did not exit within 60 s (status, stop)"""


def _add_store(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store-dir", type=Path, default=DEFAULT_STORE_DIR, metavar="DIR",
                        help="the store directory (default: ./store)")


def _add_where(parser: argparse.ArgumentParser) -> None:
    """status and stop: which engine (see ``find_engine``)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--store-dir", type=Path, metavar="DIR",
                       help="the store directory (default: ./store if an engine runs there, else the engine "
                            "serving --endpoint)")
    where.add_argument("--endpoint", metavar="URL",
                       help="the engine serving this client endpoint (default tcp://127.0.0.1:10911, where the "
                            "client commands go)")


_HELP = argparse.RawDescriptionHelpFormatter

# The examples under each command's --help (%(prog)s is how it was run: "rmqpy-server start" or
# "python -m supervisor start").
_EXAMPLES = {
    "": """examples:
  %(prog)s start --store-dir /var/lib/rmqpy --config /etc/rmqpy/engine.toml
  %(prog)s status --store-dir /var/lib/rmqpy
  %(prog)s stop --store-dir /var/lib/rmqpy

Without --store-dir, status and stop look at ./store, then for the engine serving --endpoint
(default tcp://127.0.0.1:10911), as the client commands find it.

Shell completion (bash): eval "$(register-python-argcomplete rmqpy-server)"

Logs: STORE/logs/<actor>.log and supervisor.log (rotated; log_format, log_file_bytes_max and
log_files_kept in the config file), raw stderr of each process in STORE/logs/<actor>.stderr.

""" + _EXIT_TABLE,
    "start": """examples:
  %(prog)s                                          # ./store on tcp://127.0.0.1:10911; Ctrl-C stops it
  %(prog)s --store-dir /var/lib/rmqpy --config /etc/rmqpy/engine.toml --detach
  %(prog)s --endpoint tcp://127.0.0.1:10912 --metrics-endpoint 127.0.0.1:9109 --store-dir /tmp/second-store

A second engine on this machine needs ports of its own: its client endpoint and its metrics
(--metrics-endpoint, or metrics_endpoint in its config file; "" for none), and any other port
its config file turns on (dashboard_endpoint, grpc_endpoint: docs/configuration.md).

Prints "ready <endpoint> store=<dir>" once every actor serves (with --detach, once the
supervisor this start began answers on that endpoint). In the foreground, log lines also go
to stderr; SIGINT or SIGTERM stops the actors in order. A start that fails says why on
stderr (the engine holding the store; the setting and address of a port in use) and leaves
the store as it was.

""" + _EXIT_TABLE,
    "stop": """examples:
  %(prog)s
  %(prog)s --store-dir /var/lib/rmqpy
  %(prog)s --endpoint tcp://127.0.0.1:10912

Waits up to 60 s for the supervisor to exit, then prints "stopped", or "stopped (not
cleanly; the next start recovers)" with exit status 5.

""" + _EXIT_TABLE,
    "status": """examples:
  %(prog)s
  %(prog)s --store-dir /var/lib/rmqpy --json

""" + _EXIT_TABLE,
}


def build_parser(prog: str = "python -m supervisor") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Run the message store engine: start its actors, "
                                     "watch and restart them, stop them in order.", epilog=_EXAMPLES[""],
                                     formatter_class=_HELP)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    start = _command(commands, "start", "start the engine (foreground unless --detach)")
    _add_store(start)
    start.add_argument("--endpoint", metavar="URL", help="client endpoint (default tcp://127.0.0.1:10911, or the "
                                                         "config file's endpoint)")
    start.add_argument("--metrics-endpoint", metavar="HOST:PORT",
                       help="where Prometheus' /metrics is served (default 127.0.0.1:9108, or the config file's "
                            "metrics_endpoint; \"\" for none)")
    start.add_argument("--config", type=Path, metavar="FILE", help="TOML file of settings (see docs/configuration.md)")
    mode = start.add_mutually_exclusive_group()
    mode.add_argument("--detach", action="store_true", help="run in the background; return once ready")
    mode.add_argument("--die-with-parent", type=int, metavar="PID",
                      help="stop cleanly when process PID, which started this one, exits (for scripts)")
    # The background supervisor that --detach starts: its stderr is a file, so it logs to its log only.
    start.add_argument("--detached-child", action="store_true", help=argparse.SUPPRESS)
    stop = _command(commands, "stop", "stop the engine running on a store directory")
    _add_where(stop)
    status = _command(commands, "status", "actors, pids, states and offsets")
    _add_where(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    add_cluster_parser(commands, _HELP)
    return parser


def _command(commands: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text,
                                                          epilog=_EXAMPLES[name], formatter_class=_HELP)
    return parser


def start_config(args: argparse.Namespace) -> StoreConfig:
    """The settings ``start`` runs with: the config file's, then the command line's (store_port follows
    the endpoint)."""
    return StoreConfig.load(args.config, endpoint=args.endpoint, metrics_endpoint=args.metrics_endpoint)


def cmd_start(args: argparse.Namespace) -> int:
    config = start_config(args)
    if config.curve_enabled:  # fail here, with the reason, rather than in the front's restarts
        # zmq.auth loads asyncio: imported only here, it costs the other starts nothing
        from engine.ipc.curve import check_authorized_keys_dir, load_server_keys, secret_keys_in

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
    if config.replication_curve_secret_key_file:  # the same: not in the replication actors' restarts
        from engine.ipc.curve import load_server_keys, secret_keys_in

        try:
            load_server_keys(config.replication_curve_secret_key_file)
        except ValueError as exc:
            raise ConfigError(f"replication_curve_secret_key_file: {exc}") from None
    if config.replication_curve_authorized_keys_dir:
        members = Path(config.replication_curve_authorized_keys_dir)
        if not members.is_dir():
            raise ConfigError(f"replication_curve_authorized_keys_dir {members} is not a directory")
        if secrets := secret_keys_in(members):
            print(f"warning: {members} holds secret keys ({', '.join(secrets)}); only the members' public "
                  "member-<broker_id>.key files are read there", file=sys.stderr)
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
        return EXIT_FAILED
    supervisor.start()
    try:
        # One write: whoever waits for "ready " may act on it at once, even kill the process that
        # started us (--die-with-parent), and a second write (print's end, under PYTHONUNBUFFERED)
        # then met a closed pipe; the BrokenPipeError ended the command before the stop below.
        _say(f"ready {config.endpoint} store={supervisor.store_dir}{degraded_note(supervisor.watch.reasons())}\n")
        supervisor.run()
    finally:
        clean = supervisor.shutdown()
    try:
        print(_stopped(clean), flush=True)
    except BrokenPipeError:  # the process reading our output is gone (--die-with-parent)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK if clean else EXIT_UNCLEAN


def _say(line: str) -> None:
    """``line`` on stdout in one write; a reader gone already is no reason to stop serving."""
    try:
        sys.stdout.write(line)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _stopped(clean: bool) -> str:
    return "stopped" if clean else "stopped (not cleanly; the next start recovers)"


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
    """Start a background supervisor and return once *it* serves.

    "Ready" means the state file names the pid of the child started here and
    the endpoint asked for, and that supervisor answers RUNNING: an engine
    already on the store is refused before anything starts, never mistaken
    for this one. A child that fails has its reason read back from its
    stderr file, and its exit status becomes ours.
    """
    store_dir = args.store_dir.resolve()
    check_store_free(store_dir)
    check_ports(config)
    try:
        (store_dir / LOG_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EngineError(f"cannot use the store directory {store_dir}: {exc.strerror or exc}") from None
    command = [sys.executable, "-m", "supervisor", "start", "--store-dir", str(store_dir), "--detached-child"]
    if args.endpoint:
        command += ["--endpoint", args.endpoint]
    if args.metrics_endpoint is not None:
        command += ["--metrics-endpoint", args.metrics_endpoint]
    if args.config:
        command += ["--config", str(args.config.resolve())]
    log_path = store_dir / LOG_DIR / "supervisor.log"  # written by the child; its raw stderr beside it
    stderr_path = log_path.with_suffix(".stderr")
    with open(stderr_path, "ab") as log_file:
        offset = log_file.tell()
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                 start_new_session=True)
    deadline = time.monotonic() + config.actor_start_timeout_ms / 1000 * 2
    while time.monotonic() < deadline:
        if child.poll() is not None:
            reason = (last_line(stderr_path, offset, prefix="error:") or last_line(stderr_path, offset)
                      or f"error: the engine exited with code {child.returncode}")
            print(reason if "; see " in reason else f"{reason} (see {log_path})", file=sys.stderr)
            return child.returncode if child.returncode > 0 else EXIT_FAILED
        if (reasons := _serves(store_dir, child.pid, config.endpoint)) is not None:
            print(f"ready {config.endpoint} store={store_dir} pid={child.pid}{degraded_note(reasons)}", flush=True)
            return EXIT_OK
        time.sleep(0.05)  # waiting on another process to appear; no event to wait on yet
    child.terminate()  # it stops in order, wherever its start has got to
    try:
        child.wait(config.actor_stop_timeout_ms / 1000 * 2)
    except subprocess.TimeoutExpired:
        child.kill()
    print(f"error: the engine did not become ready within {config.actor_start_timeout_ms * 2} ms and was "
          f"stopped; see {log_path} and {stderr_path}", file=sys.stderr)
    return EXIT_FAILED


def _serves(store_dir: Path, pid: int, endpoint: str) -> list[str] | None:
    """Once the supervisor ``pid`` on ``store_dir`` answers on ``endpoint`` with every actor running:
    why it is DEGRADED ([] if RUNNING: its disk may refuse writes); None until then."""
    try:
        state = supervisor_state(store_dir)
        if state.get("pid") != pid or state.get("endpoint") != endpoint:
            return None  # not (yet) the one started here
        reply = control(store_dir, StatusQuery(), timeout_ms=500)
    except (NotRunning, ControlTimeout):
        return None
    if reply.endpoint != endpoint or any(actor.lifecycle != "RUNNING" for actor in reply.actors):
        return None
    return reply.reasons


def _find(args: argparse.Namespace) -> tuple[Path, int]:
    store_dir, state = find_engine(args.store_dir, args.endpoint, default_store=DEFAULT_STORE_DIR)
    pid = state["pid"]
    assert isinstance(pid, int), pid  # supervisor_state checked it
    return store_dir, pid


def cmd_stop(args: argparse.Namespace) -> int:
    """Ask the supervisor to stop, wait for it to exit, then say whether the stop was clean.

    The abort marker, which only a clean stop removes (``Supervisor.shutdown``),
    is the store's own durable record of it: the same answer the foreground
    start prints, whatever happens to this command or the supervisor's reply.
    """
    store_dir, pid = _find(args)
    try:
        control(store_dir, StopCommand())
    except ControlTimeout:
        print(f"error: the supervisor (pid {pid}) of {store_dir} did not answer the stop request within 5 s",
              file=sys.stderr)
        return EXIT_NO_ANSWER
    try:
        psutil.Process(pid).wait(timeout=60)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        print(f"error: the supervisor (pid {pid}) of {store_dir} did not exit within 60 s", file=sys.stderr)
        return EXIT_NO_ANSWER
    clean = not (store_dir / ABORT_FILE).exists()
    print(_stopped(clean))
    return EXIT_OK if clean else EXIT_UNCLEAN


def _role(actors: list[ActorStatus], offsets: dict[str, int]) -> str:
    """``replica``, ``master`` (with replicas: how many in sync) or ``standalone``, from the actors that run."""
    names = {a.name for a in actors}
    epoch = f", epoch {offsets['epoch']}" if offsets.get("epoch") else ""  # elected on etcd
    if "replication-receiver" in names:
        return f"replica{f' ({epoch[2:]})' if epoch else ''}"
    if "replication-sender" in names:
        return f"master (replicas in sync: {offsets.get('in_sync_replicas', 0)}{epoch})"
    return "standalone"


def cmd_status(args: argparse.Namespace) -> int:
    try:
        store_dir, pid = _find(args)
    except NotRunning as exc:
        print(json.dumps({"state": "STOPPED"}) if args.json else exc)
        return EXIT_NOT_RUNNING
    try:
        reply = control(store_dir, StatusQuery())
    except ControlTimeout:
        print(f"error: the supervisor (pid {pid}) of {store_dir} did not answer within 5 s", file=sys.stderr)
        return EXIT_NO_ANSWER
    offsets = reply.offsets
    role = _role(reply.actors, offsets)
    if args.json:
        print(json.dumps({"state": reply.state, "role": role, "reasons": reply.reasons, "endpoint": reply.endpoint,
                          "store_dir": str(store_dir), "pid": pid, "offsets": offsets,
                          "actors": [{"name": a.name, "pid": a.pid, "state": a.lifecycle, "restarts": a.restarts,
                                      "condition": a.condition, **a.detail} for a in reply.actors]}, indent=2))
        return EXIT_OK
    print(f"engine {reply.state} on {reply.endpoint} store={store_dir} pid={pid} role={role}")
    for reason in reply.reasons:
        print(f"  degraded: {reason}")
    width = max(10, *(len(a.name) for a in reply.actors))
    print(f"{'actor':<{width}} {'pid':>8} {'state':<10} {'restarts':>8}  detail")
    for a in reply.actors:
        detail = " ".join(f"{k}={v}" for k, v in a.detail.items())
        print(f"{a.name:<{width}} {a.pid:>8} {a.lifecycle:<10} {a.restarts:>8}  {detail}")
    print("offsets: " + " ".join(f"{k}={v}" for k, v in offsets.items()))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """``rmqpy-server`` and ``python -m supervisor``: every outcome is an ``EXIT_*`` status."""
    parser = build_parser("rmqpy-server" if Path(sys.argv[0]).name == "rmqpy-server" else "python -m supervisor")
    argcomplete.autocomplete(parser)  # answers a completing shell and exits; otherwise does nothing
    args = parser.parse_args(argv)
    try:
        commands = {"start": cmd_start, "stop": cmd_stop, "status": cmd_status, "cluster": cmd_cluster}
        return commands[args.command](args)
    except BrokenPipeError:  # the reader of our output left (status | head): not a failure of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except (ConfigError, StoreHeld, NotRunning, ControlTimeout, EngineError, OSError) as exc:
        # OSError: a store or log file the engine could not use
        code = next(code for kind, code in _EXIT_FOR if isinstance(exc, kind))
        print(exc if isinstance(exc, NotRunning) else f"error: {exc}", file=sys.stderr)
        return code


# The exit status of each failure, the first match winning (StoreHeld is an EngineError).
_EXIT_FOR: list[tuple[type[Exception], int]] = [
    (ConfigError, EXIT_USAGE), (StoreHeld, EXIT_HELD), (NotRunning, EXIT_NOT_RUNNING),
    (ControlTimeout, EXIT_NO_ANSWER), (EngineError, EXIT_FAILED), (OSError, EXIT_FAILED),
]

if __name__ == "__main__":
    raise SystemExit(main())
