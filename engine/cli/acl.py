"""``acl``: a store's users and policies (``config/acl.json``, docs/security.md), or a cluster's in
etcd (``engine/coordination/cluster_acl.py``), edited in place. WHERE is ``--store-dir DIR`` or
``--cluster URLS`` (etcd's endpoints; ``--etcd-ca-file`` and the others over https).

    python -m engine acl user add NAME WHERE [--access-key AK] [--secret-key SK]
                                             [--curve-public-key KEY] [--tls-common-name CN] [--super]
    python -m engine acl user remove NAME WHERE
    python -m engine acl user list WHERE [--json]
    python -m engine acl policy grant USER RESOURCE ACTIONS WHERE [--deny] [--source CIDR ...]
    python -m engine acl policy revoke USER RESOURCE WHERE
    python -m engine acl policy list WHERE [--user USER] [--json]

A store's file is written whole (its owner's only); a running engine reads it again within a
second, and the change is written to ``logs/audit-cli.jsonl`` with the operating-system user who
made it. A cluster's is changed in one etcd transaction; each engine takes it into its own file
within ``cluster_routes_refresh_ms`` and writes the change, with that user, to its audit log.
A SecretKey not given is made here (``secrets``) and printed once.
"""

from __future__ import annotations

import argparse
import getpass
import json
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from engine.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_command,
    add_credentials_option,
    add_etcd_options,
    etcd_login,
    etcd_tls,
)
from engine.config import StoreConfig
from engine.logs import LOG_DIR
from engine.security.acl import ACTIONS, AclError, AclFile, Policy, User, save
from engine.security.acl import load as load_acl
from engine.security.audit import AuditLog

EXAMPLES = """examples:
  %(prog)s user add orders-service --store-dir /var/lib/rmqpy --access-key orders
  %(prog)s policy grant orders-service topic:orders pub --store-dir /var/lib/rmqpy
  %(prog)s policy grant analytics 'topic:orders-*' sub --store-dir /var/lib/rmqpy --source 10.0.0.0/8
  %(prog)s policy grant orders-service topic:orders-secret '*' --deny --store-dir /var/lib/rmqpy
  %(prog)s policy list --store-dir /var/lib/rmqpy --json

Resources: topic:NAME, group:NAME, cluster:NAME; NAME literal, a prefix ending in *, or *; * alone is
every resource. Actions (comma-separated): pub, sub, create, delete, admin, or * for all."""


class Refused(Exception):
    """A change that is not made (the message says why)."""


@dataclass(frozen=True)
class Change:
    """An edit of the ACL: the ACL it makes, what the audit log says of it, what is printed."""
    acl: AclFile
    op: str
    fields: dict[str, Any]
    said: str


def _audit_store(store_dir: Path, change: Change) -> None:
    defaults = StoreConfig()
    audit = AuditLog(store_dir / LOG_DIR / "audit-cli.jsonl", bytes_max=defaults.audit_log_bytes_max,
                     files_kept=defaults.audit_log_files_kept)
    try:
        audit.record("admin", op=change.op, subject=getpass.getuser(), source="cli", **change.fields)
    finally:
        audit.close()


def run_acl(args: argparse.Namespace) -> int:
    if bool(args.store_dir) == bool(args.cluster):
        print("give the store (--store-dir DIR) or the cluster's etcd (--cluster URLS), one of them", file=sys.stderr)
        return EXIT_USAGE
    if args.store_dir and not args.store_dir.is_dir():
        print(f"{args.store_dir} is not a directory (give the store's --store-dir)", file=sys.stderr)
        return EXIT_USAGE
    edit: Callable[[argparse.Namespace, AclFile], Change] | None = _EDITS.get((args.what, args.verb))
    try:
        if edit is None:  # a listing
            return _LISTINGS[(args.what, args.verb)](args, _current(args))
        if args.store_dir:
            change = edit(args, _current(args))
            save(args.store_dir, change.acl)
            _audit_store(args.store_dir, change)
        else:
            change = _change_cluster(args, edit)
    except (Refused, AclError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(change.said)
    return EXIT_OK


def _etcd(args: argparse.Namespace) -> Any:
    from engine.coordination.etcd import Etcd

    return Etcd(args.cluster.split(","), timeout_ms=3_000, tls=etcd_tls(args), login=etcd_login(args))


def _current(args: argparse.Namespace) -> AclFile:
    if args.store_dir:
        acl = load_acl(args.store_dir)
        return acl.file if acl is not None else AclFile()
    from engine.coordination.cluster_acl import acl_of, read_acl
    from engine.coordination.etcd import EtcdUnavailable

    try:
        entry = read_acl(_etcd(args), args.cluster_name)
    except EtcdUnavailable as exc:
        raise Refused(f"the cluster's etcd does not answer: {exc}") from None
    return acl_of(entry) if entry is not None else AclFile()


def _change_cluster(args: argparse.Namespace, edit: Callable[[argparse.Namespace, AclFile], Change]) -> Change:
    """The change applied to the cluster's ACL in etcd (again to others' changes if they raced it);
    each engine takes it within cluster_routes_refresh_ms and writes it to its audit log."""
    from engine.coordination.cluster_acl import AclChangeRaced, change_acl
    from engine.coordination.etcd import EtcdUnavailable

    made: list[Change] = []

    def apply(acl: AclFile) -> tuple[AclFile, dict[str, Any]]:
        made[:] = [edit(args, acl)]
        return made[0].acl, {"op": made[0].op, "subject": getpass.getuser(), "source": "cli", **made[0].fields}

    try:
        change_acl(_etcd(args), args.cluster_name, apply)
    except (EtcdUnavailable, AclChangeRaced) as exc:
        raise Refused(f"the cluster's ACL is unchanged: {exc}") from None
    change = made[0]
    return Change(change.acl, change.op, change.fields,
                  f"{change.said} (cluster {args.cluster_name}: each engine takes it within cluster_routes_refresh_ms)")


def _op(args: argparse.Namespace) -> str:
    return f"acl {args.what} {args.verb}"


def user_add(args: argparse.Namespace, acl: AclFile) -> Change:
    if args.name in acl.users:
        raise Refused(f"user {args.name!r} exists (remove it first)")
    if not (args.access_key or args.curve_public_key or args.tls_common_name):
        raise Refused("a user needs --access-key or --tls-common-name (gRPC), or --curve-public-key (the client "
                      "endpoint)")
    secret = args.secret_key or secrets.token_urlsafe(24)
    user = User(access_key=args.access_key or "", secret_key=secret if args.access_key else "",
                curve_public_key=args.curve_public_key or "", tls_common_name=args.tls_common_name or "",
                super=args.super)
    shown = args.access_key and not args.secret_key
    return Change(AclFile(users={**acl.users, args.name: user}, policies=acl.policies), _op(args),
                  {"resource": f"user:{args.name}", "action": "super" if args.super else ""},
                  f"user {args.name} added" + (f"; its SecretKey (shown once): {secret}" if shown else ""))


def user_remove(args: argparse.Namespace, acl: AclFile) -> Change:
    if args.name not in acl.users:
        raise Refused(f"no user {args.name!r}")
    users = {name: user for name, user in acl.users.items() if name != args.name}
    policies = [p for p in acl.policies if p.user != args.name]
    return Change(AclFile(users=users, policies=policies), _op(args), {"resource": f"user:{args.name}"},
                  f"user {args.name} removed, with its {len(acl.policies) - len(policies)} policies")


def user_list(args: argparse.Namespace, acl: AclFile) -> int:
    rows = [{"user": name, "access_key": user.access_key, "curve_public_key": user.curve_public_key,
             "super": user.super} for name, user in sorted(acl.users.items())]  # never the secrets
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['user']:<24} {row['access_key'] or '-':<24} {row['curve_public_key'] or '-':<42}"
                  f"{' super' if row['super'] else ''}")
    return EXIT_OK


def policy_grant(args: argparse.Namespace, acl: AclFile) -> Change:
    actions = [a.strip() for a in args.actions.split(",") if a.strip()]
    policy = Policy(user=args.user, resource=args.resource, actions=actions,
                    decision="deny" if args.deny else "allow", sources=list(args.source or ()))
    return Change(AclFile(users=acl.users, policies=[*acl.policies, policy]), _op(args),
                  {"resource": args.resource, "action": ",".join(actions), "target": args.user,
                   "decision": policy.decision},
                  f"{policy.decision} {args.user} {','.join(actions)} on {args.resource}"
                  + (f" from {', '.join(policy.sources)}" if policy.sources else ""))


def policy_revoke(args: argparse.Namespace, acl: AclFile) -> Change:
    kept = [p for p in acl.policies if not (p.user == args.user and p.resource == args.resource)]
    if len(kept) == len(acl.policies):
        raise Refused(f"no policy of {args.user!r} on {args.resource!r}")
    return Change(AclFile(users=acl.users, policies=kept), _op(args),
                  {"resource": args.resource, "target": args.user},
                  f"{len(acl.policies) - len(kept)} policies of {args.user} on {args.resource} revoked")


def policy_list(args: argparse.Namespace, acl: AclFile) -> int:
    rows = [p for p in acl.policies if args.user in (None, p.user)]
    if args.json:
        print(msgspec.json.encode(rows).decode())
    else:
        for p in rows:
            print(f"{p.decision:<5} {p.user:<24} {','.join(p.actions):<24} {p.resource}"
                  + (f"  from {', '.join(p.sources)}" if p.sources else ""))
    return EXIT_OK


_EDITS = {("user", "add"): user_add, ("user", "remove"): user_remove, ("policy", "grant"): policy_grant,
          ("policy", "revoke"): policy_revoke}
_LISTINGS = {("user", "list"): user_list, ("policy", "list"): policy_list}


def add(commands: Any) -> None:
    acl = add_command(commands, "acl", "the store's users and policies (who may do what; docs/security.md)",
                      EXAMPLES)
    whats = acl.add_subparsers(dest="what", required=True, metavar="user|policy")
    user = whats.add_parser("user", help="add, remove or list users")
    user_verbs = user.add_subparsers(dest="verb", required=True, metavar="add|remove|list")
    user_add_parser = user_verbs.add_parser("add", help="add a user")
    user_add_parser.add_argument("name")
    user_add_parser.add_argument("--access-key", help="its AccessKey, for the gRPC port's signed calls")
    user_add_parser.add_argument("--secret-key", help="its SecretKey (default: one made here, printed once)")
    user_add_parser.add_argument("--curve-public-key", metavar="KEY",
                                 help="its CURVE public key (40 Z85 characters), for the ZeroMQ ports")
    user_add_parser.add_argument("--tls-common-name", metavar="CN",
                                 help="the common name of its TLS client certificate (grpc_tls_client_ca_file)")
    user_add_parser.add_argument("--super", action="store_true", help="may do everything")
    user_remove_parser = user_verbs.add_parser("remove", help="remove a user and its policies")
    user_remove_parser.add_argument("name")
    user_list_parser = user_verbs.add_parser("list", help="list the users (never their secrets)")
    user_list_parser.add_argument("--json", action="store_true")
    policy = whats.add_parser("policy", help="grant, revoke or list policies")
    policy_verbs = policy.add_subparsers(dest="verb", required=True, metavar="grant|revoke|list")
    grant = policy_verbs.add_parser("grant", help="allow (or with --deny, deny) a user actions on a resource")
    grant.add_argument("user")
    grant.add_argument("resource", help="topic:NAME, group:NAME, cluster:NAME (NAME, PREFIX* or *), or *")
    grant.add_argument("actions", help=f"comma-separated: {', '.join(ACTIONS)}, or *")
    grant.add_argument("--deny", action="store_true", help="a deny policy (deny wins over allow)")
    grant.add_argument("--source", action="append", metavar="CIDR", help="only from these addresses (repeat)")
    revoke = policy_verbs.add_parser("revoke", help="remove a user's policies on a resource")
    revoke.add_argument("user")
    revoke.add_argument("resource")
    listing = policy_verbs.add_parser("list", help="list the policies")
    listing.add_argument("--user", help="only this user's")
    listing.add_argument("--json", action="store_true")
    for parser in (user_add_parser, user_remove_parser, user_list_parser, grant, revoke, listing):
        where = parser.add_argument_group("where the users and policies are (one of them)")
        where.add_argument("--store-dir", type=Path, metavar="DIR", help="the store (config/acl.json)")
        where.add_argument("--cluster", metavar="URLS",
                           help="a cluster's etcd (its client endpoints, comma-separated): every broker set's")
        where.add_argument("--cluster-name", default="DefaultCluster", help="the cluster (default DefaultCluster)")
        add_etcd_options(where)
        add_credentials_option(where)
        parser.set_defaults(handler=run_acl)
