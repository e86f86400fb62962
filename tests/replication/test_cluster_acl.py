"""A cluster's users and policies in etcd (``engine/coordination/cluster_acl.py``): two operators
changing them at once lose neither change; an engine elected on that etcd takes each new revision
into its own ``config/acl.json`` and writes each change once to its audit log, also after its
membership actor restarts; an ACL in etcd that cannot be used is refused and the engine keeps its
own."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from engine.config import StoreConfig
from engine.coordination.cluster_acl import acl_key, change_acl, changes_prefix, read_acl
from engine.coordination.etcd import Etcd
from engine.ipc.control import EventStream
from engine.logs import LOG_DIR
from engine.security.acl import AclFile, User, load
from harness.broker_set import broker_set
from harness.faults import actor_pids
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(120)


def add_user(name: str) -> object:
    def edit(acl: AclFile) -> tuple[AclFile, dict[str, str]]:
        return AclFile(users={**acl.users, name: User(access_key=name, secret_key="s")}, policies=acl.policies), \
            {"op": "acl user add", "subject": "test", "resource": f"user:{name}"}
    return edit



def audited(store_dir: Path) -> list[str]:
    path = store_dir / LOG_DIR / "audit-membership.jsonl"
    return [json.loads(line)["resource"] for line in path.read_text().splitlines()] if path.exists() else []


def test_changes_raced_lose_nothing_and_each_engine_takes_and_audits_each_once(tmp_path: Path) -> None:
    config = StoreConfig.test_min().replace(cluster_routes_refresh_ms=100)
    with broker_set(tmp_path, config, engines=1) as brokers:
        master = brokers.wait_master()
        etcd = Etcd(brokers.etcd.endpoints.split(","), timeout_ms=3_000)
        names = [[f"op{k}-user{n}" for n in range(12)] for k in range(2)]

        def operator(mine: list[str]) -> None:
            for name in mine:
                change_acl(etcd, config.cluster_name, add_user(name))  # type: ignore[arg-type]

        threads = [threading.Thread(target=operator, args=(mine,)) for mine in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        every = {name for mine in names for name in mine}
        entry = read_acl(etcd, config.cluster_name)
        assert entry is not None and set(entry.value["acl"]["users"]) == every  # neither operator's lost
        assert len(etcd.get_prefix(changes_prefix(config.cluster_name))) == len(every)
        wait_until("the engine never took the cluster's ACL",
                 lambda: set(getattr(load(master.store_dir), "file", AclFile()).users) == every)
        wait_until("not every change reached the audit log", lambda: len(audited(master.store_dir)) == len(every))
        assert sorted(audited(master.store_dir)) == sorted(f"user:{name}" for name in every)

        # Its membership actor killed and restarted: nothing written to the audit log twice
        events = EventStream(master.store_dir)
        try:
            os.kill(actor_pids(master.store_dir)["membership"], signal.SIGKILL)
            events.wait_for("actor.running", name="membership", timeout_ms=30_000)
        finally:
            events.close()
        change_acl(etcd, config.cluster_name, add_user("after-the-restart"))  # type: ignore[arg-type]
        wait_until("the change after the restart was not audited",
                 lambda: "user:after-the-restart" in audited(master.store_dir))
        assert len(audited(master.store_dir)) == len(every) + 1

        # An ACL in etcd that cannot be used (a policy for an unknown action): the engine keeps its own
        etcd.put(acl_key(config.cluster_name), {"acl": {"users": {}, "policies": [
            {"user": "x", "resource": "topic:t", "actions": ["fly"]}]}})
        log = master.store_dir / LOG_DIR / "membership.log"
        wait_until("the unusable ACL was not refused", lambda: "cannot be used" in log.read_text())
        kept = load(master.store_dir)
        assert kept is not None and "after-the-restart" in kept.file.users
