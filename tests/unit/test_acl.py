"""The ACL model (``engine/security/acl.py``): resources literal, by prefix and ``*``; deny wins;
sources; super users; unknown subjects; the file written for its owner only and read back."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from engine.security.acl import ACL_FILE, Acl, AclError, AclFile, Check, Policy, User, load, parse, save

pytestmark = pytest.mark.timeout(10)


def acl(*policies: Policy) -> Acl:
    return Acl(AclFile(users={"orders": User(access_key="ak-orders", secret_key="s1"),
                              "analytics": User(curve_public_key="k" * 40),
                              "ops": User(super=True, access_key="ak-ops", secret_key="s2")},
                       policies=list(policies)))


def test_literal_prefix_and_star_resources_and_deny_winning() -> None:
    rules = acl(Policy(user="orders", resource="topic:orders", actions=["pub"]),
                Policy(user="orders", resource="topic:orders-*", actions=["*"]),
                Policy(user="orders", resource="topic:orders-secret*", actions=["sub"], decision="deny"),
                Policy(user="analytics", resource="*", actions=["sub"]))
    assert rules.authorize("orders", [Check("topic", "orders", "pub")]) is None
    refused = rules.authorize("orders", [Check("topic", "orders", "sub")])
    assert refused is not None and refused.code == "FORBIDDEN" and refused.resource == "topic:orders"
    assert "may not sub on topic:orders (no policy allows it)" in refused.message
    assert rules.authorize("orders", [Check("topic", "orders-eu", "delete")]) is None
    denied = rules.authorize("orders", [Check("topic", "orders-eu", "pub"), Check("topic", "orders-secret", "sub")])
    assert denied is not None and "(a policy denies it)" in denied.message
    assert rules.authorize("orders", [Check("topic", "orders-secret", "pub")]) is None  # denied sub only
    assert rules.authorize("analytics", [Check("topic", "x", "sub"), Check("group", "g", "sub")]) is None
    assert rules.authorize("analytics", [Check("cluster", "c", "admin")]) is not None
    assert rules.authorize("ops", [Check("cluster", "c", "admin")]) is None  # super


def test_sources_limit_a_policy_to_address_ranges() -> None:
    rules = acl(Policy(user="orders", resource="topic:orders", actions=["pub"], sources=["10.0.0.0/8", "::1/128"]))
    assert rules.authorize("orders", [Check("topic", "orders", "pub")], "10.1.2.3") is None
    assert rules.authorize("orders", [Check("topic", "orders", "pub")], "::1") is None
    assert rules.authorize("orders", [Check("topic", "orders", "pub")], "192.168.0.1") is not None
    assert rules.authorize("orders", [Check("topic", "orders", "pub")], "") is not None  # an ipc:// client


def test_an_unknown_subject_is_unauthenticated_and_keys_find_their_users() -> None:
    rules = acl()
    refused = rules.authorize(None, [Check("topic", "orders", "pub")])
    assert refused is not None and refused.code == "UNAUTHENTICATED"
    assert rules.authorize("nobody", []) is not None
    assert rules.secret_of("ak-orders") == ("orders", "s1") and rules.secret_of("ak-none") is None
    assert rules.by_curve_key["k" * 40] == "analytics"


@pytest.mark.parametrize(("policy", "error"), [
    (Policy(user="orders", resource="queue:x", actions=["pub"]), "use TYPE:NAME"),
    (Policy(user="orders", resource="topic:a*b", actions=["pub"]), "use TYPE:NAME"),
    (Policy(user="orders", resource="topic:", actions=["pub"]), "use TYPE:NAME"),
    (Policy(user="orders", resource="topic:x", actions=["write"]), "actions"),
    (Policy(user="orders", resource="topic:x", actions=[]), "actions"),
    (Policy(user="orders", resource="topic:x", actions=["pub"], sources=["10.0.0.300/8"]), "sources"),
    (Policy(user="ghost", resource="topic:x", actions=["pub"]), "not in users"),
])
def test_an_acl_that_cannot_be_used_is_refused_with_what_is_wrong(policy: Policy, error: str) -> None:
    with pytest.raises(AclError, match=error):
        acl(policy)


def test_two_users_with_one_key_are_refused() -> None:
    with pytest.raises(AclError, match="the same key"):
        Acl(AclFile(users={"a": User(access_key="x"), "b": User(access_key="x")}))


def test_the_file_is_its_owner_s_only_and_reads_back(tmp_path: Path) -> None:
    assert load(tmp_path) is None
    written = AclFile(users={"orders": User(access_key="ak", secret_key="sk")},
                      policies=[Policy(user="orders", resource="topic:orders", actions=["pub"])])
    save(tmp_path, written)
    assert stat.S_IMODE((tmp_path / ACL_FILE).stat().st_mode) == 0o600
    loaded = load(tmp_path)
    assert loaded is not None and loaded.file == written
    with pytest.raises(AclError, match="not an ACL file"):
        parse(b'{"users": 3}')


def test_a_check_of_either_action_needs_one_of_them() -> None:
    rules = acl(Policy(user="orders", resource="topic:orders", actions=["pub"]),
                Policy(user="analytics", resource="topic:orders", actions=["sub"]),
                Policy(user="analytics", resource="topic:orders", actions=["pub"], decision="deny"))
    assert rules.authorize("orders", [Check("topic", "orders", "pub|sub")]) is None
    assert rules.authorize("analytics", [Check("topic", "orders", "pub|sub")]) is None  # sub is allowed
    refused = rules.authorize("orders", [Check("topic", "other", "pub|sub")])
    assert refused is not None and "may not pub or sub on topic:other" in refused.message
