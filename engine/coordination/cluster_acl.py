"""A cluster's users and policies, held in etcd so that every broker set agrees (docs/security.md).

    /rmqpy/<cluster_name>/acl                    {"acl": {users, policies}}: config/acl.json's shape
    /rmqpy/<cluster_name>/acl-changes/<20 digits> {"op", "subject", "source", "resource", ...}: one
                                                 change each, named by the time it was made (ns),
                                                 the newest CHANGES_KEPT kept

``rmqpy acl ... --cluster ETCD`` changes both in one transaction that compares the ACL's revision
(two operators changing it at once: neither change is lost; the second is applied to the first's
result). Each engine's membership actor takes a new revision into its own ``config/acl.json``
(the front and the gRPC endpoint read it again within a second) and writes each change it has
not written yet to its audit log (``audited_file``: the last one written, kept over restarts); an
engine of a cluster without the key keeps its own file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from engine.coordination.etcd import Entry, Etcd, delete_before, modified_at, put
from engine.security.acl import Acl, AclFile

CHANGE_TRIES_MAX = 20  # changes raced by others' before one gives up
CHANGES_KEPT = 1_000  # the newest changes in etcd: an engine down for longer misses the older ones' lines
AUDITED_FILE = Path("config") / "acl-changes-audited"  # in the store: the last change written to the audit log


class AclChangeRaced(RuntimeError):
    """Others changed the cluster's ACL at every try."""


def acl_key(cluster_name: str) -> str:
    return f"/rmqpy/{cluster_name}/acl"


def changes_prefix(cluster_name: str) -> str:
    return f"/rmqpy/{cluster_name}/acl-changes/"


def acl_of(entry: Entry) -> AclFile:
    """The ACL an entry holds; AclError (or msgspec's ValidationError) if it cannot be used."""
    acl = msgspec.convert(entry.value["acl"], AclFile)
    Acl(acl)  # refuses what would not load
    return acl


def read_acl(etcd: Etcd, cluster_name: str) -> Entry | None:
    return etcd.get(acl_key(cluster_name))


def change_acl(etcd: Etcd, cluster_name: str,
               edit: Callable[[AclFile], tuple[AclFile, dict[str, Any]]]) -> AclFile:
    """``edit`` applied to the cluster's ACL (an empty one if it has none): the ACL it makes and the
    change as the audit logs are to say it, written only if nobody changed the ACL meanwhile, else
    applied again to theirs. ``edit`` raises to refuse."""
    key, prefix = acl_key(cluster_name), changes_prefix(cluster_name)
    for _ in range(CHANGE_TRIES_MAX):
        entry = etcd.get(key)
        edited, change = edit(acl_of(entry) if entry is not None else AclFile())
        Acl(edited)
        name = f"{prefix}{time.time_ns():020d}"
        writes = [put(key, {"acl": msgspec.to_builtins(edited)}), put(name, change)]
        if etcd.transaction([modified_at(key, entry.mod_revision if entry else 0)], writes):
            _prune(etcd, prefix)
            return edited
    raise AclChangeRaced(f"the cluster's ACL changed under each of {CHANGE_TRIES_MAX} tries")


def _prune(etcd: Etcd, prefix: str) -> None:
    names = [entry.key for entry in etcd.get_prefix(prefix)]
    if len(names) > CHANGES_KEPT:
        etcd.transaction([], [delete_before(prefix, sorted(names)[-CHANGES_KEPT])])


def changes_after(etcd: Etcd, cluster_name: str, store_dir: Path) -> list[Entry]:
    """The changes in etcd this store has not written to its audit log yet, oldest first."""
    try:
        audited = (store_dir / AUDITED_FILE).read_text().strip()
    except FileNotFoundError:
        audited = ""
    return sorted((e for e in etcd.get_prefix(changes_prefix(cluster_name)) if e.key > audited),
                  key=lambda e: e.key)


def mark_audited(store_dir: Path, entry: Entry) -> None:
    path = store_dir / AUDITED_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(entry.key + "\n")
    os.replace(tmp, path)
