"""``rmqpy-server cluster``: a master and its replicas on this machine, or several broker sets, for a local try.

``cluster start --dir D --replicas N`` writes one config per engine into ``D`` (a master on
``--port``, its replication endpoint on the port after it, replica ``k`` on ``--port + 10 k``
following it) and starts each engine in the background (``start --detach``), the master first;
``cluster.json`` in ``D`` names them. ``cluster status`` prints each engine's role, epoch, master
and how far its log is behind the master's, with its supervisor's pid, and each etcd member's
health (``cluster_status.py``; ``--json``: the same, as JSON); ``cluster stop`` stops the replicas,
then the master. ``cluster start`` refuses a directory whose cluster runs.

Roles are fixed (a replica is promoted by hand), unless ``--etcd``: then etcd is started too
(``--etcd-members``, three by default: a quorum that loses nothing when one member is lost; in
``D/etcd``, client and peer ports from ``--etcd-port`` on), every engine listens for replicas and
is given every member's client endpoint, and etcd elects the master among them, again when it is
lost (docs/replication.md, "Failover"); ``cluster stop`` stops etcd last.

``--broker-sets N`` (etcd implied): N broker sets (``broker-a``, ``broker-b``, ...) of a master
and ``--replicas`` replicas each, on one etcd: a cluster (docs/cluster.md). Set ``s``'s engine
``k`` is ``<broker>-<k>`` on ``--port + 100 s + 10 k``; topics are spread over the sets with
``rmqpy topics --cluster``. ``cluster add --dir D`` grows such a cluster by one broker set (the
next name, the next ports, ``--replicas`` as given), started on the same etcd; existing queues
stay where they are.

``cluster start-engine NAME`` and ``cluster stop-engine NAME`` start (detached, on its own config)
or stop one engine of the cluster, by the name ``cluster status`` prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from engine.config import StoreConfig
from supervisor.cluster_engines import (
    EXIT_FAILED,
    EXIT_NOT_RUNNING,
    EXIT_OK,
    EXIT_RUNNING,
    EXIT_USAGE,
    running,
    start_engine,
    start_engines,
    stop_engine,
    stop_one,
)
from supervisor.cluster_secure import ADMIN_FILE, SecureCluster
from supervisor.cluster_status import (
    CLUSTER_FILE,
    engine_rows,
    etcd_rows,
    operator_context,
    read_cluster,
    status_lines,
)
from supervisor.etcd_server import EtcdCluster, EtcdNotInstalled, EtcdPortInUse, member_ports, stop_pids
from supervisor.launcher import write_config

BROKER_SETS_MAX = 26  # broker-a ... broker-z
ETCD_MEMBERS_MAX = 7  # etcd's own advice: more members only slow its writes


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


def _etcd_members(text: str) -> int:
    """An argparse type: an odd count of etcd members from 1 to 7 (an even count tolerates no more
    lost members than the odd count below it, and needs one more for its quorum)."""
    value = _whole(1, ETCD_MEMBERS_MAX)(text)
    if value % 2 == 0:
        raise argparse.ArgumentTypeError(f"{value} is even: {value} members lose their quorum with as few members "
                                         f"lost as {value - 1} do (1, 3, 5 or 7)")
    return value


def add_cluster_parser(commands: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    text = "a master and its replicas, or broker sets, on this machine (start, add, status, stop, start-engine, " \
           "stop-engine)"
    cluster = commands.add_parser("cluster", help=text, description=text, formatter_class=formatter,
                                  epilog="examples:\n  %(prog)s start --dir cluster --replicas 2\n"
                                         "  %(prog)s status --dir cluster [--json]\n"
                                         "  %(prog)s stop-engine broker-1 --dir cluster\n"
                                         "  %(prog)s start-engine broker-1 --dir cluster\n"
                                         "  %(prog)s stop --dir cluster\n")
    actions = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="write the configs and start every engine")
    start.add_argument("--replicas", type=_REPLICAS, default=2, help="replicas of the master (default 2)")
    start.add_argument("--port", type=_PORT, default=10911, help="the master's client port (default 10911)")
    start.add_argument("--replication-mode", choices=("ASYNC", "SYNC"), default="ASYNC",
                       help="SYNC: a send is answered once the in-sync replicas hold it (default ASYNC)")
    start.add_argument("--etcd", action="store_true",
                       help="start etcd too (Debian's etcd-server) and let the engines elect their master there")
    start.add_argument("--etcd-port", type=_whole(1, 65535 - 2 * ETCD_MEMBERS_MAX + 1), default=2379,
                       help="etcd's first client port: member k's client port is this + 2 k, its peer port the "
                            "next (default 2379)")
    start.add_argument("--etcd-members", type=_etcd_members, default=3,
                       help="etcd members (odd, 1 to 7; default 3: one can be lost; 1: no member can)")
    start.add_argument("--broker-sets", type=_whole(1, BROKER_SETS_MAX), default=1,
                       help="broker sets of a cluster on one etcd (more than 1 implies --etcd; default 1)")
    start.add_argument("--insecure", action="store_true",
                       help="no keys, users or TLS: anyone who reaches a port may do anything (a try on a machine "
                            "nobody else uses). Without it: a CA of the cluster's own, etcd over TLS with client "
                            "certificates and its own users, CURVE and users on the client ports (an admin user, "
                            "its credentials in DIR/secrets/admin.json), each engine its own replication key "
                            "(docs/security.md)")
    add = actions.add_parser("add", help="one more broker set on the cluster's etcd (a cluster started with --etcd)")
    add.add_argument("--replicas", type=_REPLICAS, default=None,
                     help="replicas of the new set's master (default: as many as the first set has)")
    status = actions.add_parser("status", help="each engine's state, role, supervisor pid, epoch, master and "
                                               "lag, and each etcd member's health")
    status.add_argument("--json", action="store_true", help="machine-readable output (the same figures)")
    starting = actions.add_parser("start-engine", help="start one stopped engine again (detached)")
    stopping = actions.add_parser("stop-engine", help="stop one engine")
    for one in (starting, stopping):
        one.add_argument("name", metavar="NAME", help="the engine, as `cluster status` names it")
    for action in (start, add, status, actions.add_parser("stop", help="stop the replicas, then the master, then etcd"),
                   starting, stopping):
        action.add_argument("--dir", type=Path, default=Path("cluster"), help="the cluster's directory")


def cmd_cluster(args: argparse.Namespace) -> int:
    return {"start": _start, "add": _add, "status": _status, "stop": _stop, "start-engine": start_engine,
            "stop-engine": stop_engine}[args.action](args)


def _engines(directory: Path) -> list[dict[str, str]]:
    engines: list[dict[str, str]] = read_cluster(directory)["engines"]
    return engines


def _start(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    runs = running(directory)
    if runs:
        print(f"error: the cluster in {directory} is running ({runs}): `cluster status --dir {args.dir}` shows "
              f"it, `cluster stop --dir {args.dir}` stops it; `cluster start-engine NAME` starts one stopped engine",
              file=sys.stderr)
        return EXIT_RUNNING
    made = read_cluster(directory) if (directory / CLUSTER_FILE).exists() else {}
    secure = SecureCluster(directory) if made.get("secure", not args.insecure) else None  # started again: as it was
    elected = args.etcd or args.broker_sets > 1
    if secure is not None:
        secure.create()  # before etcd, whose members serve with its certificates
    try:
        etcd = EtcdCluster(directory / "etcd", member_ports(args.etcd_port, args.etcd_members),
                           tls=secure.member_tls() if secure else None) if elected else None
    except EtcdNotInstalled as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    before = made.get("etcd_endpoints")
    if etcd is not None and before and before != etcd.endpoints:  # its members' data holds their first layout
        print(f"error: the cluster in {directory} was started on etcd members {before}, not {etcd.endpoints}: "
              f"start it with the same --etcd-port and --etcd-members, or in a new directory", file=sys.stderr)
        return EXIT_USAGE
    directory.mkdir(parents=True, exist_ok=True)
    replication = f"tcp://127.0.0.1:{args.port + 1}"
    layout: dict[str, object] = {"port": args.port, "replication_mode": args.replication_mode,
                                 "etcd_endpoints": etcd.endpoints if etcd is not None else ""}
    layout["secure"] = secure is not None
    if secure is not None and etcd is not None:
        layout.update(etcd_tls=asdict(secure.operator_tls()), etcd_login=asdict(secure.operator_login()))
    engines = []
    for index in range(args.broker_sets):
        if etcd is not None:
            engines += _write_set(directory, layout, index, args.replicas, alone=args.broker_sets == 1, secure=secure)
            continue
        for k in range(args.replicas + 1):  # roles fixed: a master and replicas of its replication endpoint
            port = args.port + 10 * k
            name = "master" if k == 0 else f"replica-{k}"
            role: dict[str, object] = {"replication_endpoint": replication, "replication_mode": args.replication_mode} \
                if k == 0 else {"replica_of": replication}  # the master is broker_id 0 (replica_of_broker_id)
            if secure is not None:
                role.update(secure.engine_settings(name, "broker-a", k, etcd=False), broker_id=k)
                secure.seed_acl(directory / name)
            engines.append(_write_engine(directory, name, port, "broker-a", role))
    if etcd is not None:
        try:
            etcd.start()
        except (EtcdPortInUse, TimeoutError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            etcd.stop()
            return EXIT_FAILED
        for member in etcd.members:
            assert member.process is not None
            print(f"{member.name:<10} {member.client_url:<24} pid={member.process.pid}", flush=True)
        if secure is not None:  # etcd's users, then the cluster's ACL, before any engine asks for them
            secure.etcd_users(etcd.endpoints, StoreConfig().cluster_name, [engine["name"] for engine in engines])
            secure.seed_cluster_acl(etcd.endpoints, StoreConfig().cluster_name)
    (directory / CLUSTER_FILE).write_text(json.dumps({"replication_endpoint": replication, **layout,
                                                      "engines": engines,
                                                      "etcd_pids": etcd.pids() if etcd else []},
                                                     indent=2) + "\n")
    code = start_engines(directory, engines)
    if code != EXIT_OK:
        _stop(args)
        return code
    if secure is not None:
        print(f"secure: clients show the admin user's credentials, {secure.root / ADMIN_FILE} (its owner's only): "
              f"`rmqpy ... --credentials {secure.root / ADMIN_FILE}`; more users: docs/security.md")
    else:
        print("insecure: no keys, users or TLS: anyone who reaches a port may do anything")
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
    added = _write_set(directory, cluster, len(brokers), replicas, alone=False,
                       secure=SecureCluster(directory) if cluster.get("secure") else None)
    if cluster.get("secure"):  # their etcd users, before they ask etcd for anything
        SecureCluster(directory).etcd_users(str(cluster["etcd_endpoints"]), StoreConfig().cluster_name,
                                            [engine["name"] for engine in added])
    cluster["engines"] = engines + added  # named before they start: `cluster stop` stops them whatever happens
    (directory / CLUSTER_FILE).write_text(json.dumps(cluster, indent=2) + "\n")
    code = start_engines(directory, added)
    if code != EXIT_OK:
        return code
    broker_name = added[0]["broker_name"]
    print(f"broker set {broker_name} joined the cluster on {cluster['etcd_endpoints']}: new topics can use it "
          f"(`rmqpy topics --cluster {cluster['etcd_endpoints']} --create T --brokers {broker_name}`); existing "
          f"queues stay where they are")
    return EXIT_OK


def _write_set(directory: Path, layout: dict[str, object], index: int, replicas: int, *,
               alone: bool, secure: SecureCluster | None = None) -> list[dict[str, str]]:
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
        name = f"broker-{k}" if alone else f"{broker_name}-{k}"
        if secure is not None:
            role.update(secure.engine_settings(name, broker_name, k))
            secure.seed_acl(directory / name)
        engines.append(_write_engine(directory, name, port, broker_name, role))
    return engines


def _write_engine(directory: Path, name: str, port: int, broker_name: str, role: dict[str, object]) -> dict[str, str]:
    endpoint = f"tcp://127.0.0.1:{port}"
    config = StoreConfig.load(None, profile="dev", endpoint=endpoint, metrics_endpoint="", **role)
    write_config(directory / f"{name}.toml", config)
    return {"name": name, "endpoint": endpoint, "store_dir": str(directory / name), "broker_name": broker_name}


def _status(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    cluster = read_cluster(directory)
    engines, etcd = engine_rows(cluster["engines"]), etcd_rows(cluster)
    if args.json:
        print(json.dumps({"dir": str(directory), "engines": engines, "etcd": etcd}, indent=2))
    else:
        print("\n".join(status_lines(engines, etcd)))
    return EXIT_OK


def _stop(args: argparse.Namespace) -> int:
    code = EXIT_OK
    for engine in reversed(_engines(args.dir.resolve())):
        returned = stop_one(engine)
        code = code or (returned if returned not in (EXIT_OK, EXIT_NOT_RUNNING) else EXIT_OK)
    cluster = read_cluster(args.dir.resolve())
    pids: list[int] = cluster.get("etcd_pids", [])
    if pids:
        stop_pids(pids, str(cluster["etcd_endpoints"]).split(","),  # written together by `cluster start`
                  context=operator_context(cluster))
        print(f"etcd       stopped (pid {', '.join(map(str, pids))})")
    return code
