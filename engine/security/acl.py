"""Who may do what: users and their policies, RocketMQ 5's ACL 2.0 cut to what this engine serves.

    config/acl.json (written whole, ``write_atomically``; ``python -m engine acl`` edits it)
    {
      "users": {
        "orders-service": {"curve_public_key": "<40 Z85 chars>", "access_key": "orders",
                           "secret_key": "<secret>"},
        "ops":            {"super": true, "access_key": "ops", "secret_key": "<secret>"}
      },
      "policies": [
        {"user": "orders-service", "resource": "topic:orders", "actions": ["pub"],
         "decision": "allow", "sources": ["10.0.0.0/8"]},
        {"user": "orders-service", "resource": "topic:orders-secret*", "actions": ["*"],
         "decision": "deny"}
      ]
    }

A user is known by a CURVE public key (the ZeroMQ ports: the key its handshake proved) or an
AccessKey whose SecretKey signs its requests, or the common name of its TLS client certificate
(the gRPC port). A resource is ``topic:NAME``,
``group:NAME`` or ``cluster:NAME``; NAME is a literal name, a prefix ending in ``*``, or ``*``;
``*`` alone is every resource. The actions are ``pub``, ``sub``, ``create``, ``delete``,
``admin`` (``*``: all of them). ``sources``: the client addresses a policy holds for (CIDR
ranges; none: from anywhere).

A request names what it does as checks, each (resource, action); it is allowed when, for every
check, a policy of its user allows the action on the resource from its source and none denies it
(deny wins). A ``super`` user may do everything. Anything else is refused: an unknown subject
``UNAUTHENTICATED``, a known one without the permission ``FORBIDDEN``, naming the resource and
the action.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from engine.store.atomic_file import read_with_backup, write_atomically

ACL_FILE = Path("config") / "acl.json"
ACTIONS = ("pub", "sub", "create", "delete", "admin")
RESOURCE_TYPES = ("topic", "group", "cluster")
Decision = Literal["allow", "deny"]
REFUSAL_CODES = ("UNAUTHENTICATED", "FORBIDDEN")


class AclError(ValueError):
    """An ACL that cannot be used: a bad resource, action, address range, or a user twice."""


class User(msgspec.Struct, kw_only=True, omit_defaults=True):
    curve_public_key: str = ""
    access_key: str = ""
    secret_key: str = ""
    tls_common_name: str = ""  # the CN of its TLS client certificate (grpc_tls_client_ca_file)
    super: bool = False


class Policy(msgspec.Struct, kw_only=True, omit_defaults=True):
    user: str
    resource: str
    actions: list[str]
    decision: Decision = "allow"
    sources: list[str] = []


class AclFile(msgspec.Struct, kw_only=True):
    users: dict[str, User] = {}
    policies: list[Policy] = []


@dataclass(frozen=True)
class Check:
    """One permission a request needs."""
    resource_type: str  # topic, group, cluster
    name: str
    action: str  # one of ACTIONS, or several joined by "|": any of them will do

    def __str__(self) -> str:
        return f"{self.action} on {self.resource_type}:{self.name}"


@dataclass(frozen=True)
class Refusal:
    code: Literal["UNAUTHENTICATED", "FORBIDDEN"]
    message: str
    resource: str = ""
    action: str = ""


class _Rule:
    """A policy compiled: its resource pattern split, its ranges parsed."""

    def __init__(self, policy: Policy) -> None:
        resource = policy.resource
        if resource == "*":
            self.resource_type, self.pattern = "*", "*"
        else:
            kind, sep, pattern = resource.partition(":")
            if not sep or kind not in RESOURCE_TYPES or not pattern or "*" in pattern[:-1]:
                raise AclError(f"resource {resource!r}: use TYPE:NAME, TYPE:PREFIX* or TYPE:* "
                               f"(TYPE one of {', '.join(RESOURCE_TYPES)}), or *")
            self.resource_type, self.pattern = kind, pattern
        unknown = [a for a in policy.actions if a != "*" and a not in ACTIONS]
        if unknown or not policy.actions:
            raise AclError(f"actions {policy.actions!r}: use some of {', '.join(ACTIONS)}, or *")
        self.actions = frozenset(ACTIONS) if "*" in policy.actions else frozenset(policy.actions)
        try:
            self.sources = [ipaddress.ip_network(s, strict=False) for s in policy.sources]
        except ValueError as exc:
            raise AclError(f"sources {policy.sources!r}: {exc}") from None
        self.deny = policy.decision == "deny"

    def matches(self, check: Check, source: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
        if check.action not in self.actions:
            return False
        if self.resource_type not in ("*", check.resource_type):
            return False
        pattern = self.pattern
        if pattern != "*" and not (check.name.startswith(pattern[:-1]) if pattern.endswith("*")
                                   else check.name == pattern):
            return False
        return not self.sources or (source is not None and any(source in net for net in self.sources))


class Acl:
    """An ``AclFile`` ready to answer: users by key, each user's compiled policies."""

    def __init__(self, acl: AclFile) -> None:
        self.file = acl
        self.by_curve_key: dict[str, str] = {}
        self.by_access_key: dict[str, str] = {}
        self.by_tls_name: dict[str, str] = {}
        for name, user in acl.users.items():
            for key, index in ((user.curve_public_key, self.by_curve_key), (user.access_key, self.by_access_key),
                               (user.tls_common_name, self.by_tls_name)):
                if key and key in index:
                    raise AclError(f"users {index[key]!r} and {name!r} have the same key {key!r}")
                if key:
                    index[key] = name
        self.rules: dict[str, list[_Rule]] = {}
        for policy in acl.policies:
            if policy.user not in acl.users:
                raise AclError(f"a policy names user {policy.user!r}, who is not in users")
            self.rules.setdefault(policy.user, []).append(_Rule(policy))

    def secret_of(self, access_key: str) -> tuple[str, str] | None:
        """(user, SecretKey) of an AccessKey, or None."""
        name = self.by_access_key.get(access_key)
        return (name, self.file.users[name].secret_key) if name is not None else None

    def authorize(self, user: str | None, checks: Iterable[Check], source: str = "") -> Refusal | None:
        """None if ``user`` may do every check from ``source`` (an IP address, "" if none); the
        refusal otherwise."""
        if user is None or user not in self.file.users:
            return Refusal("UNAUTHENTICATED", "this client is not a known user (a key or AccessKey the ACL "
                                              "does not hold)")
        if self.file.users[user].super:
            return None
        rules = self.rules.get(user, ())
        address = _address(source) if any(rule.sources for rule in rules) else None
        for check in checks:
            why = ""
            for action in check.action.split("|"):  # any of them will do (a route: pub or sub)
                one = check if action == check.action else Check(check.resource_type, check.name, action)
                matching = [rule for rule in rules if rule.matches(one, address)]
                if matching and not any(rule.deny for rule in matching):
                    break
                why = why or ("a policy denies it" if matching else "")
            else:
                return Refusal("FORBIDDEN", f"user {user!r} may not {check.action.replace('|', ' or ')} on "
                                            f"{check.resource_type}:{check.name} ({why or 'no policy allows it'})",
                               f"{check.resource_type}:{check.name}", check.action)
        return None


def _address(source: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(source) if source else None
    except ValueError:
        return None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AclFile)


def parse(data: bytes) -> Acl:
    """An ACL from its file's bytes; AclError if it cannot be used."""
    try:
        return Acl(_decoder.decode(data))
    except (msgspec.DecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, AclError):
            raise
        raise AclError(f"not an ACL file: {exc}") from None


def load(store_dir: Path) -> Acl | None:
    """The store's ACL (its ``.bak`` if a crash left the file bad), or None if it has none;
    AclError if what it holds cannot be used."""
    path = store_dir / ACL_FILE
    if not path.exists() and not path.with_name(path.name + ".bak").exists():
        return None
    acl = read_with_backup(path, parse)
    if acl is None:
        return parse(path.read_bytes())  # raises: neither copy is an ACL
    return acl


def save(store_dir: Path, acl: AclFile) -> None:
    """Write the store's ACL, readable by its owner only (it holds secrets)."""
    Acl(acl)  # refuse what would not load
    write_atomically(store_dir / ACL_FILE, msgspec.json.format(_encoder.encode(acl), indent=2) + b"\n", mode=0o600)
