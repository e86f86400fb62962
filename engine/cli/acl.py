"""``acl``: the store's users and policies (``config/acl.json``, docs/security.md), edited in place.

    python -m engine acl user add NAME --store-dir DIR [--access-key AK] [--secret-key SK]
                                       [--curve-public-key KEY] [--super]
    python -m engine acl user remove NAME --store-dir DIR
    python -m engine acl user list --store-dir DIR [--json]
    python -m engine acl policy grant USER RESOURCE ACTIONS --store-dir DIR [--deny] [--source CIDR ...]
    python -m engine acl policy revoke USER RESOURCE --store-dir DIR
    python -m engine acl policy list --store-dir DIR [--user USER] [--json]

The file is written whole (its owner's only); a running engine reads it again within a second.
Every change is written to ``logs/audit-cli.jsonl`` with the operating-system user who made it.
A SecretKey not given is made here (``secrets``) and printed once.
"""

from __future__ import annotations

import argparse
import getpass
import json
import secrets
import sys
from pathlib import Path
from typing import Any

import msgspec

from engine.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, add_command
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


def _read(store_dir: Path) -> AclFile:
    acl = load_acl(store_dir)
    return acl.file if acl is not None else AclFile()


def _write(store_dir: Path, acl: AclFile, op: str, **fields: Any) -> None:
    save(store_dir, acl)
    defaults = StoreConfig()
    audit = AuditLog(store_dir / LOG_DIR / "audit-cli.jsonl", bytes_max=defaults.audit_log_bytes_max,
                     files_kept=defaults.audit_log_files_kept)
    try:
        audit.record("admin", op=op, subject=getpass.getuser(), source="cli", **fields)
    finally:
        audit.close()


def run_acl(args: argparse.Namespace) -> int:
    store_dir: Path = args.store_dir
    if not store_dir.is_dir():
        print(f"{store_dir} is not a directory (give the store's --store-dir)", file=sys.stderr)
        return EXIT_USAGE
    try:
        acl = _read(store_dir)
        return int(_HANDLERS[(args.what, args.verb)](args, store_dir, acl))
    except AclError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_FAILED


def user_add(args: argparse.Namespace, store_dir: Path, acl: AclFile) -> int:
    if args.name in acl.users:
        print(f"refused: user {args.name!r} exists (remove it first)", file=sys.stderr)
        return EXIT_FAILED
    if not (args.access_key or args.curve_public_key or args.tls_common_name):
        print("a user needs --access-key or --tls-common-name (gRPC), or --curve-public-key (the client endpoint)",
              file=sys.stderr)
        return EXIT_USAGE
    secret = args.secret_key or (secrets.token_urlsafe(24) if args.access_key else "")
    user = User(access_key=args.access_key or "", secret_key=secret, curve_public_key=args.curve_public_key or "",
                tls_common_name=args.tls_common_name or "", super=args.super)
    _write(store_dir, AclFile(users={**acl.users, args.name: user}, policies=acl.policies), "acl user add",
           resource=f"user:{args.name}", action="super" if args.super else "")
    print(f"user {args.name} added" + (f"; its SecretKey (shown once): {secret}" if secret and not args.secret_key
                                       else ""))
    return EXIT_OK


def user_remove(args: argparse.Namespace, store_dir: Path, acl: AclFile) -> int:
    if args.name not in acl.users:
        print(f"no user {args.name!r}", file=sys.stderr)
        return EXIT_FAILED
    users = {name: user for name, user in acl.users.items() if name != args.name}
    policies = [p for p in acl.policies if p.user != args.name]
    _write(store_dir, AclFile(users=users, policies=policies), "acl user remove", resource=f"user:{args.name}")
    print(f"user {args.name} removed, with its {len(acl.policies) - len(policies)} policies")
    return EXIT_OK


def user_list(args: argparse.Namespace, store_dir: Path, acl: AclFile) -> int:
    rows = [{"user": name, "access_key": user.access_key, "curve_public_key": user.curve_public_key,
             "super": user.super} for name, user in sorted(acl.users.items())]  # never the secrets
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['user']:<24} {row['access_key'] or '-':<24} {row['curve_public_key'] or '-':<42}"
                  f"{' super' if row['super'] else ''}")
    return EXIT_OK


def policy_grant(args: argparse.Namespace, store_dir: Path, acl: AclFile) -> int:
    actions = [a.strip() for a in args.actions.split(",") if a.strip()]
    policy = Policy(user=args.user, resource=args.resource, actions=actions,
                    decision="deny" if args.deny else "allow", sources=list(args.source or ()))
    _write(store_dir, AclFile(users=acl.users, policies=[*acl.policies, policy]), "acl policy grant",
           resource=args.resource, action=",".join(actions), target=args.user, decision=policy.decision)
    print(f"{policy.decision} {args.user} {','.join(actions)} on {args.resource}"
          + (f" from {', '.join(policy.sources)}" if policy.sources else ""))
    return EXIT_OK


def policy_revoke(args: argparse.Namespace, store_dir: Path, acl: AclFile) -> int:
    kept = [p for p in acl.policies if not (p.user == args.user and p.resource == args.resource)]
    if len(kept) == len(acl.policies):
        print(f"no policy of {args.user!r} on {args.resource!r}", file=sys.stderr)
        return EXIT_FAILED
    _write(store_dir, AclFile(users=acl.users, policies=kept), "acl policy revoke", resource=args.resource,
           target=args.user)
    print(f"{len(acl.policies) - len(kept)} policies of {args.user} on {args.resource} revoked")
    return EXIT_OK


def policy_list(args: argparse.Namespace, store_dir: Path, acl: AclFile) -> int:
    rows = [p for p in acl.policies if args.user in (None, p.user)]
    if args.json:
        print(msgspec.json.encode(rows).decode())
    else:
        for p in rows:
            print(f"{p.decision:<5} {p.user:<24} {','.join(p.actions):<24} {p.resource}"
                  + (f"  from {', '.join(p.sources)}" if p.sources else ""))
    return EXIT_OK


_HANDLERS = {("user", "add"): user_add, ("user", "remove"): user_remove, ("user", "list"): user_list,
             ("policy", "grant"): policy_grant, ("policy", "revoke"): policy_revoke,
             ("policy", "list"): policy_list}


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
        parser.add_argument("--store-dir", type=Path, required=True, metavar="DIR", help="the store")
        parser.set_defaults(handler=run_acl)
