"""``rmqpy-server cluster``: a master and its replicas on this machine, or several broker sets, for a local try.

``cluster start --dir D --replicas N`` writes one config per engine into ``D`` (a master on
``--port``, its replication endpoint on the port after it, replica ``k`` on ``--port + 10 k``
following it) and starts each engine in the background (``start --detach``), the master first;
``cluster.json`` in ``D`` names them. ``cluster status`` prints each engine's role and how far its
log is behind the master's, with its supervisor's pid (``--json``: the same, as JSON); ``cluster stop``
stops the replicas, then the master.

Roles are fixed (a replica is promoted by hand), unless ``--etcd``: then etcd is started too
(one member, in ``D/etcd``), every engine listens for replicas, and etcd elects the master among
them, again when it is lost (docs/replication.md, "Failover"); ``cluster stop`` stops etcd last.

``--broker-sets N`` (etcd implied): N broker sets (``broker-a``, ``broker-b``, ...) of a master
and ``--replicas`` replicas each, on one etcd: a cluster (docs/cluster.md). Set ``s``'s engine
``k`` is ``<broker>-<k>`` on ``--port + 100 s + 10 k``; topics are spread over the sets with
``rmqpy topics --cluster``. ``cluster add --dir D`` grows such a cluster by one broker set (the
next name, the next ports, ``--replicas`` as given), started on the same etcd; existing queues
stay where they are.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from engine.config import StoreConfig
from engine.ipc.control import ControlTimeout, NotRunning, control, supervisor_state
from engine.ipc.messages import StatusQuery
from supervisor.etcd_server import EtcdCluster, EtcdNotInstalled, EtcdPortInUse, stop_pids
from supervisor.launcher import write_config

CLUSTER_FILE = "cluster.json"
EXIT_OK, EXIT_FAILED = 0, 1
BROKER_SETS_MAX = 26  # broker-a ... broker-z


def _whole(least: int, most: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``least`` to ``most``, else a usage error (status 2)
    naming the bounds, before anything is written or started."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"{text} is not from {least} to {most}")
        return value
    return parse


_REPLICAS = _whole(0, 9)  # replica k listens on --port + 10 k: the next broker set's ports start at + 100
_PORT = _whole(1, 65535)


def add_cluster_parser(commands: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    text = "a master and its replicas on this machine (start, status, stop)"
    cluster = commands.add_parser("cluster", help=text, description=text, formatter_class=formatter,
                                  epilog="examples:\n  %(prog)s start --dir cluster --replicas 2\n"
                                         "  %(prog)s status --dir cluster [--json]\n  %(prog)s stop --dir cluster\n")
    actions = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="write the configs and start every engine")
    start.add_argument("--replicas", type=_REPLICAS, default=2, help="replicas of the master (default 2)")
    start.add_argument("--port", type=_PORT, default=10911, help="the master's client port (default 10911)")
    start.add_argument("--replication-mode", choices=("ASYNC", "SYNC"), default="ASYNC",
                       help="SYNC: a send is answered once the in-sync replicas hold it (default ASYNC)")
    start.add_argument("--etcd", action="store_true",
                       help="start etcd too (Debian's etcd-server) and let the engines elect their master there")
    start.add_argument("--etcd-port", type=_whole(1, 65534), default=2379,
                       help="etcd's client port (peer: the next; default 2379)")
    start.add_argument("--broker-sets", type=_whole(1, BROKER_SETS_MAX), default=1,
                       help="broker sets of a cluster on one etcd (more than 1 implies --etcd; default 1)")
    add = actions.add_parser("add", help="one more broker set on the cluster's etcd (a cluster started with --etcd)")
    add.add_argument("--replicas", type=_REPLICAS, default=None,
                     help="replicas of the new set's master (default: as many as the first set has)")
    status = actions.add_parser("status", help="each engine's state, role, supervisor pid, log end and lag")
    status.add_argument("--json", action="store_true", help="machine-readable output (the same figures)")
    for action in (start, add, status, actions.add_parser("stop", help="stop the replicas, then the master")):
        action.add_argument("--dir", type=Path, default=Path("cluster"), help="the cluster's directory")


def cmd_cluster(args: argparse.Namespace) -> int:
    return {"start": _start, "add": _add, "status": _status, "stop": _stop}[args.action](args)


def _engines(directory: Path) -> list[dict[str, str]]:
    try:
        engines: list[dict[str, str]] = json.loads((directory / CLUSTER_FILE).read_text())["engines"]
    except FileNotFoundError:
        raise SystemExit(f"error: no cluster in {directory} (cluster start --dir {directory})") from None
    return engines


def _start(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    elected = args.etcd or args.broker_sets > 1
    replication = f"tcp://127.0.0.1:{args.port + 1}"
    etcd = EtcdCluster(directory / "etcd", [(args.etcd_port, args.etcd_port + 1)]) if elected else None
    layout = {"port": args.port, "replication_mode": args.replication_mode,
              "etcd_endpoints": etcd.endpoints if etcd is not None else ""}
    engines = []
    for index in range(args.broker_sets):
        if etcd is not None:
            engines += _write_set(directory, layout, index, args.replicas, alone=args.broker_sets == 1)
            continue
        for k in range(args.replicas + 1):  # roles fixed: a master and replicas of its replication endpoint
            port = args.port + 10 * k
            name = "master" if k == 0 else f"replica-{k}"
            role: dict[str, object] = {"replication_endpoint": replication, "replication_mode": args.replication_mode} \
                if k == 0 else {"replica_of": replication}
            engines.append(_write_engine(directory, name, port, "broker-a", role))
    if etcd is not None:
        try:
            etcd.start()
        except (EtcdNotInstalled, EtcdPortInUse, TimeoutError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            etcd.stop()
            return EXIT_FAILED
        print(f"etcd       {etcd.endpoints:<24} pid={etcd.pids()[0]}", flush=True)
    (directory / CLUSTER_FILE).write_text(json.dumps({"replication_endpoint": replication, **layout,
                                                      "engines": engines,
                                                      "etcd_pids": etcd.pids() if etcd else []},
                                                     indent=2) + "\n")
    code = _start_engines(directory, engines)
    if code != EXIT_OK:
        _stop(args)
        return code
    if etcd is not None and args.broker_sets > 1:
        print(f"a cluster of {args.broker_sets} broker sets elected on etcd ({args.replication_mode}); "
              f"rmqpy's Cluster and `rmqpy topics --cluster` take etcd's address: {etcd.endpoints}")
    elif etcd is not None:
        address = ",".join(engine["endpoint"] for engine in engines)
        print(f"elected on etcd ({args.replication_mode}); rmqpy's producers take the set's address: {address}")
    else:
        print(f"replication {replication} ({args.replication_mode}); writes go to the master, reads to any")
    return EXIT_OK


def _add(args: argparse.Namespace) -> int:
    """One more broker set: the next name and ports, on the cluster's etcd; written into cluster.json."""
    directory: Path = args.dir.resolve()
    cluster = json.loads((directory / CLUSTER_FILE).read_text()) if (directory / CLUSTER_FILE).exists() else None
    if cluster is None or not cluster.get("etcd_endpoints"):
        print(f"error: no cluster elected on etcd in {directory} (cluster start --dir {directory} --etcd, or "
              f"--broker-sets N)", file=sys.stderr)
        return EXIT_FAILED
    engines: list[dict[str, str]] = cluster["engines"]
    brokers = sorted({engine["broker_name"] for engine in engines})
    replicas = args.replicas if args.replicas is not None else \
        sum(engine["broker_name"] == brokers[0] for engine in engines) - 1
    added = _write_set(directory, cluster, len(brokers), replicas, alone=False)
    cluster["engines"] = engines + added  # named before they start: `cluster stop` stops them whatever happens
    (directory / CLUSTER_FILE).write_text(json.dumps(cluster, indent=2) + "\n")
    code = _start_engines(directory, added)
    if code != EXIT_OK:
        return code
    broker_name = added[0]["broker_name"]
    print(f"broker set {broker_name} joined the cluster on {cluster['etcd_endpoints']}: new topics can use it "
          f"(`rmqpy topics --cluster {cluster['etcd_endpoints']} --create T --brokers {broker_name}`); existing "
          f"queues stay where they are")
    return EXIT_OK


def _write_set(directory: Path, layout: dict[str, object], index: int, replicas: int, *,
               alone: bool) -> list[dict[str, str]]:
    """The configs of broker set ``index`` (``broker-a``, ``broker-b``...): engines that elect their
    master on the cluster's etcd, each listening for replicas. A send creates no topic there
    (``auto_create_topic = false``, docs/cluster.md): it would create it on whichever set took it,
    so topics are created over the sets (``rmqpy topics --cluster ETCD --create``)."""
    broker_name = f"broker-{chr(ord('a') + index)}"
    engines = []
    for k in range(replicas + 1):
        port = int(str(layout["port"])) + 100 * index + 10 * k
        role: dict[str, object] = {"replication_endpoint": f"tcp://127.0.0.1:{port + 1}",
                                   "replication_mode": layout["replication_mode"],
                                   "etcd_endpoints": layout["etcd_endpoints"], "broker_id": k,
                                   "broker_name": broker_name, "auto_create_topic": False}
        engines.append(_write_engine(directory, f"broker-{k}" if alone else f"{broker_name}-{k}", port, broker_name,
                                     role))
    return engines


def _write_engine(directory: Path, name: str, port: int, broker_name: str, role: dict[str, object]) -> dict[str, str]:
    endpoint = f"tcp://127.0.0.1:{port}"
    config = StoreConfig.load(None, profile="dev", endpoint=endpoint, metrics_endpoint="", **role)
    write_config(directory / f"{name}.toml", config)
    return {"name": name, "endpoint": endpoint, "store_dir": str(directory / name), "broker_name": broker_name}


def _start_engines(directory: Path, engines: list[dict[str, str]]) -> int:
    for engine in engines:
        started = subprocess.run([sys.executable, "-m", "supervisor", "start", "--config",
                                  str(directory / f"{engine['name']}.toml"), "--store-dir", engine["store_dir"],
                                  "--detach"], capture_output=True, text=True, check=False)
        if started.returncode != 0:
            print(f"error: {engine['name']} did not start: {started.stderr.strip()}", file=sys.stderr)
            return started.returncode
        print(f"{engine['name']:<10} {engine['endpoint']:<24} store={engine['store_dir']}", flush=True)
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    rows = _status_rows(args.dir.resolve())
    if args.json:
        print(json.dumps({"dir": str(args.dir.resolve()), "engines": rows}, indent=2))
        return EXIT_OK
    for row in rows:
        where = f"{row['name']:<10} {row['endpoint']:<24}"
        if row["state"] == "STOPPED":
            print(f"{where} not running ({row['reason']})")
            continue
        epoch = f" epoch={row['epoch']}" if "epoch" in row else ""
        lag = f" in_sync_replicas={row['in_sync_replicas']}" if row["role"] == "master" else \
            f" behind_bytes={row['behind_bytes']}"
        print(f"{where} {row['state']:<9} {row['role']:<8} pid={row['pid']} log_end={row['log_end']}{epoch}{lag}")
    return EXIT_OK


def _status_rows(directory: Path) -> list[dict[str, object]]:
    """What ``cluster status`` shows of each engine, its text and its ``--json`` alike: state ``STOPPED``
    with the reason, or the state, the role, the supervisor's pid (its state file's), the log's end, and
    a master's in-sync replicas or a replica's bytes behind its set's master."""
    rows: list[dict[str, object]] = []
    master_end = None
    broker_name = None
    for engine in _engines(directory):
        if engine.get("broker_name") != broker_name:  # a set's master comes first: the others' lag is to it
            broker_name, master_end = engine.get("broker_name"), None
        row: dict[str, object] = {"name": engine["name"], "endpoint": engine["endpoint"],
                                  "store_dir": engine["store_dir"], "broker_name": engine.get("broker_name")}
        rows.append(row)
        try:
            pid = supervisor_state(Path(engine["store_dir"]))["pid"]
            reply = control(Path(engine["store_dir"]), StatusQuery(), timeout_ms=2_000)
        except (NotRunning, ControlTimeout) as exc:
            row.update(state="STOPPED", reason=str(exc))
            continue
        end = reply.offsets.get("written_offset", 0)
        if master_end is None:
            master_end = end
        role = "replica" if "replication-receiver" in {actor.name for actor in reply.actors} else "master"
        row.update(state=reply.state, role=role, pid=pid, log_end=end)
        if reply.offsets.get("epoch"):
            row["epoch"] = reply.offsets["epoch"]
        if role == "master":
            row["in_sync_replicas"] = reply.offsets.get("in_sync_replicas", 0)
        else:
            row["behind_bytes"] = max(0, master_end - end)
    return rows


def _stop(args: argparse.Namespace) -> int:
    code = EXIT_OK
    for engine in reversed(_engines(args.dir.resolve())):
        stopped = subprocess.run([sys.executable, "-m", "supervisor", "stop", "--store-dir", engine["store_dir"]],
                                 capture_output=True, text=True, check=False)
        print(f"{engine['name']:<10} {(stopped.stdout or stopped.stderr).strip()}")
        code = code or (stopped.returncode if stopped.returncode not in (0, 3) else 0)
    pids = json.loads((args.dir.resolve() / CLUSTER_FILE).read_text()).get("etcd_pids", [])
    if pids:
        stop_pids(pids)
        print(f"etcd       stopped (pid {', '.join(map(str, pids))})")
    return code
