"""What every command shares: exit codes, the engine's endpoint and client, output, options."""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from engine.client import DEFAULT_ENDPOINT, EngineUnreachable, StoreClient, engine_answers, master_of_set
from engine.ipc.curve import CurveKeys
from engine.ipc.endpoints import read_engine_state
from engine.ipc.protocol import INT32_MAX, INT64_MAX
from engine.store.system_topics import PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC

if TYPE_CHECKING:  # etcd's client loads requests: only the commands that reach etcd import it
    from engine.coordination.etcd import EtcdLogin, EtcdTls
    from rmqpy.credentials import Credentials

# Exit codes (docs/client.md, "Exit codes of rmqpy"): every path ends in one of these, with one
# line on stderr saying why (none for a closed pipe: `rmqpy consume ... | head` is not an error).
EXIT_OK = 0
EXIT_FAILED = 1  # the engine refused the request, or what was asked is not there (check: findings)
EXIT_USAGE = 2  # a bad command line (argparse's own code)
EXIT_NO_ENGINE = 3  # nothing accepts a connection at the endpoint, or no engine runs on --store-dir
EXIT_TIMEOUT = 4  # the engine took a request but sent no reply before --timeout-ms
EXIT_OS_ERROR = 5  # a local file or directory could not be read or written
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_BROKEN_PIPE = 141  # stdout was closed by its reader (128 + SIGPIPE)


def engine_endpoint(args: argparse.Namespace) -> str:
    if args.endpoint:
        endpoint: str = args.endpoint
        return endpoint
    if args.store_dir:
        return str(read_engine_state(args.store_dir)["endpoint"])
    return DEFAULT_ENDPOINT


def credentials(args: argparse.Namespace) -> Credentials | None:
    """``--credentials FILE`` (``rmqpy.Credentials``: what ``cluster start`` writes for its admin
    user), or None; a usage error naming the file if it holds none."""
    path = getattr(args, "credentials", None)
    if not path:
        return None
    from rmqpy.credentials import Credentials

    try:
        return Credentials.load(path)
    except ValueError as exc:
        print(f"error: --credentials: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def curve_keys(args: argparse.Namespace) -> CurveKeys | None:
    if not (args.server_key or args.client_key):
        given = credentials(args)
        return given.curve if given is not None else None
    if not (args.server_key and args.client_key):
        print("error: CURVE needs both --server-key and --client-key", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    return CurveKeys.from_files(args.server_key, args.client_key)


def connect(args: argparse.Namespace, *, timeout_ms: int, kind: type[StoreClient] = StoreClient) -> StoreClient:
    curve = curve_keys(args)
    endpoint = reachable_endpoint(args)

    def following(master: str) -> None:
        print(f"note: {endpoint} is a replica; sending to its master, {master}", file=sys.stderr)

    return kind(endpoint, timeout_ms=timeout_ms, curve=curve, on_master=following)


def reachable_endpoint(args: argparse.Namespace) -> str:
    """The endpoint of the engine the options name (a broker set's: its master), once it accepts a
    connection; ``EngineUnreachable`` if nothing does, a usage error if it is no endpoint at all."""
    endpoint = engine_endpoint(args)
    if "," in endpoint:  # a broker set's engines: the one its route names master
        members = [part.strip() for part in endpoint.split(",") if part.strip()]
        endpoint = master_of_set(members) or members[0]
    try:
        answers = engine_answers(endpoint)  # at once, rather than at the end of the deadline
    except zmq.ZMQError as exc:  # not an endpoint ZeroMQ can connect to: "foo", "tcp://host" without a port
        print(f"error: --endpoint {endpoint!r}: {exc.strerror} (the form is tcp://HOST:PORT or ipc://PATH)",
              file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    if not answers:
        raise EngineUnreachable(endpoint)
    return endpoint


def printable(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable(v) for v in value]
    return value


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(printable(data), indent=2) if args.json else text)


def message_line(m: dict[str, Any]) -> str:
    """One message on one line; fields a message does not have (no tags, no keys) are left out."""
    body = printable(m["body"])
    shown = body if len(body) <= 60 else body[:57] + "..."
    where = (f"{m['broker_name']}:" if "broker_name" in m else "") + f"{m['topic']}/{m['queue_id']}"
    parts = [f"{where}@{m['queue_offset']}", f"id={m['msg_id']}"]
    if m.get("uniq_key"):
        parts.append(f"uniq_key={m['uniq_key']}")
    if m.get("tags") is not None:
        parts.append(f"tags={m['tags']}")
    if m.get("keys"):
        parts.append(f"keys={','.join(m['keys'])}")
    properties = m.get("properties") or {}
    if PROPERTY_REAL_TOPIC in properties:  # a delayed or half message waiting in a system topic
        parts.append(f"waiting for {properties[PROPERTY_REAL_TOPIC]}/{properties.get(PROPERTY_REAL_QID, '?')}")
    parts.append(f"body={shown!r}")
    return " ".join(parts)


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    cluster = parser.add_argument_group("a cluster of broker sets (docs/cluster.md)")
    cluster.add_argument("--cluster", metavar="ADDRESS",
                         help="the cluster instead of one engine: etcd's client endpoints (http://host:port, "
                              "comma-separated) or any engine of it (tcp://host:port)")
    cluster.add_argument("--cluster-name", default="DefaultCluster", help="the cluster (default DefaultCluster)")
    add_etcd_options(cluster)


def add_credentials_option(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--credentials", type=Path, metavar="FILE",
                       help="a secure cluster's credentials file (cluster start writes DIR/secrets/admin.json): "
                            "the CURVE keys and etcd's certificate and user, where not given one by one")


def add_etcd_options(group: argparse._ArgumentGroup) -> None:
    """etcd over TLS with a client certificate (https:// endpoints), as etcd's own user: ``cluster
    start`` makes them in DIR/secrets (ca.pem, operator-etcd.pem, operator-etcd.key,
    operator-etcd-password, for the user ``operator``)."""
    group.add_argument("--etcd-ca-file", metavar="FILE", help="etcd over https: the CA of its members' certificates")
    group.add_argument("--etcd-cert-file", metavar="FILE", help="etcd over https: this client's certificate")
    group.add_argument("--etcd-key-file", metavar="FILE", help="etcd over https: this client's key")
    group.add_argument("--etcd-user", metavar="NAME", help="etcd with auth enabled: its user")
    group.add_argument("--etcd-password-file", metavar="FILE", help="etcd with auth enabled: the user's password")


def etcd_tls(args: argparse.Namespace) -> EtcdTls | None:
    """The command's TLS to etcd, or None; a usage error unless the three files come together."""
    files = (args.etcd_ca_file, args.etcd_cert_file, args.etcd_key_file)
    if not any(files):
        given = credentials(args)
        return given.etcd_tls if given is not None else None
    if not all(files):
        print("error: etcd over TLS needs --etcd-ca-file, --etcd-cert-file and --etcd-key-file together",
              file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    from engine.coordination.etcd import EtcdTls

    return EtcdTls(*files)


def etcd_login(args: argparse.Namespace) -> EtcdLogin | None:
    """The command's etcd user, or None; a usage error unless the name and the password file come together."""
    if not (args.etcd_user or args.etcd_password_file):
        given = credentials(args)
        return given.etcd_login if given is not None else None
    if not (args.etcd_user and args.etcd_password_file):
        print("error: etcd's user needs --etcd-user and --etcd-password-file together", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    from engine.coordination.etcd import EtcdLogin

    return EtcdLogin(args.etcd_user, args.etcd_password_file)


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("engine connection")
    where.add_argument("--endpoint", metavar="URL", help=f"the engine's client endpoint (default {DEFAULT_ENDPOINT}); "
                       "a broker set's engines separated by commas: its master")
    where.add_argument("--store-dir", type=Path, metavar="DIR",
                       help="reach the engine running on this store directory (its endpoint is read from it)")
    where.add_argument("--timeout-ms", type=deadline_ms, default=10_000, metavar="MS",
                       help="deadline of each request, in ms (default 10000)")
    where.add_argument("--server-key", type=Path, metavar="FILE", help="CURVE: the engine's public key file (NAME.key)")
    where.add_argument("--client-key", type=Path, metavar="FILE",
                       help="CURVE: this client's secret key file (NAME.key_secret)")
    add_credentials_option(where)
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout (and no progress bar)")


# The integer options are checked where they are parsed, against what the wire takes
# (engine/ipc/protocol.py): a value past it is a usage error naming the bound, not an
# OverflowError from msgpack, nor a refusal of the engine after the connection.
# A wait of the client's own (--timeout-ms, --wait-ms) ends in one ZeroMQ poll, whose timeout is
# a C int; a request waits --timeout-ms plus --wait-ms, so each stays within half of it.
WAIT_MS_MAX = INT32_MAX // 2  # 1073741823 ms, about 12 days


def positive(text: str) -> int:
    """A count or size: 0 or less is a usage error, caught before anything is sent."""
    value = _integer(text, INT64_MAX)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number (1 or more)")
    return value


def non_negative(text: str) -> int:
    """An offset or a time in ms: 0 or more, and a signed 64-bit integer (the wire's Int64)."""
    value = _integer(text, INT64_MAX)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def queue_number(text: str) -> int:
    """A queue's number: 0 or more, and a signed 32-bit integer (the wire's Int32)."""
    value = _integer(text, INT32_MAX)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def deadline_ms(text: str) -> int:
    """A deadline of the client's own, in ms: 1 to WAIT_MS_MAX."""
    value = wait_time_ms(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number (1 or more)")
    return value


def wait_time_ms(text: str) -> int:
    """How long to wait for a message, in ms: 0 to WAIT_MS_MAX."""
    value = _integer(text, WAIT_MS_MAX, unit=" ms (about 12 days)")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _integer(text: str, most: int, *, unit: str = "") -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value > most:
        raise argparse.ArgumentTypeError(f"{text} is too large (at most {most}{unit})")
    return value


def epoch_ms(text: str) -> int:
    """A time as epoch ms, from digits or from ISO 8601 (a time without a zone is UTC), from 1970 on."""
    if text.isascii() and text.isdigit():
        return _integer(text, INT64_MAX)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither epoch ms nor an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    value = int(moment.timestamp() * 1000)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is before 1970 (epoch ms are 0 or more)")
    return value


# Each command's --help keeps its examples' lines as written (%(prog)s is how it was run: "rmqpy
# produce" or "python -m engine produce").
HELP_FORMAT = argparse.RawDescriptionHelpFormatter


def add_command(commands: Any, name: str, help_text: str, examples: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text,
                                                          epilog=examples, formatter_class=HELP_FORMAT)
    return parser
