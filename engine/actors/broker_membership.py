"""The broker membership actor: this engine's place in its broker set, kept in etcd.

With ``etcd_endpoints``, it starts first (wave 0) and decides the role the other actors start in
(``role.json`` in the run directory; the supervisor reads it): a replica of the master etcd
names, or the master itself when it wins an election (``engine/coordination/broker_set.py``).
Then, every tick:

* it renews its lease (every quarter of ``master_lease_ms``). A master moves the lease deadline
  slot to the renewal's send time + ``master_lease_ms`` - ``master_fence_margin_ms``: the writer
  and the front refuse writes past it, so a master that cannot renew (etcd out of reach, the
  process stopped) stops writing before etcd can let the lease expire and elect another;
* a master checks that the ``master`` key is still the one it created and publishes its in-sync
  set (the sender's in-sync replicas and itself) by a transaction that holds only while it is
  master. The set etcd holds is put in a slot: the sender waits for every replica in it, as well
  as its own in-sync ones, before it answers a SYNC send, so a replica leaves the set in etcd
  before a send is answered without it. It also publishes the topics its broker set serves
  (``engine/coordination/routes.py``: the routes clients of a cluster of broker sets read);
* a replica watches ``master``: another master (a new epoch) or none (an election, which it
  joins while in the in-sync set) changes its role.

A role taken or changed is written to ``role.json`` and told to the supervisor (``RoleChanged`` on
the ``control`` channel, the role in it), which starts the other actors in it, or kills them, cuts
the log where it forks from the new master's (``epochs``), and starts them again in the new role.
The epoch is in a slot: replication refuses a master or replica of an older one.

Every request to etcd is made off the loop (``off_loop.py``): one step at a time in a thread that
wakes the loop when it is done, so that a slow etcd (up to ``etcd_request_timeout_ms`` a request
and endpoint) never stalls the loop and its heartbeats. The start does not wait for a role either:
the actor runs at once, its steps look for one, and the supervisor waits for its ``RoleChanged``.
"""

from __future__ import annotations

import json
import logging

import msgspec

from engine.actors.base import Actor, Env, Handler, Port, main
from engine.actors.effects import Effects, Tell
from engine.actors.off_loop import OffLoop
from engine.coordination.broker_set import BrokerSetKeys, choose, history
from engine.coordination.cluster_acl import acl_of, changes_after, mark_audited, read_acl
from engine.coordination.etcd import Entry, Etcd, EtcdLogin, EtcdTls, EtcdUnavailable, created_at, delete
from engine.coordination.role import Role, mask, members_of
from engine.coordination.routes import RoutePublisher, read_cluster
from engine.coordination.routes_mirror import ROUTES_MIRROR_FILE
from engine.ipc.channels import CONTROL, ClientFrame
from engine.ipc.endpoints import MASTER_ENDPOINT_FILE, REPLICA_APPEND_LOCK
from engine.ipc.messages import ControlReply, encoder
from engine.ipc.wire import Inbound
from engine.logs import LOG_DIR, event
from engine.security.acl import AclError
from engine.security.acl import load as load_acl
from engine.security.acl import save as save_acl
from engine.security.audit import AuditLog
from engine.services.recovery import plan_commit_log_recovery
from engine.store.append_fence import AppendFence
from engine.store.atomic_file import write_atomically
from engine.store.shared_offsets import EPOCH, IN_SYNC_IDS, IN_SYNC_PUBLISHED, LEASE_DEADLINE, WRITTEN

log = logging.getLogger(__name__)
FOLLOW_TICK_MS = 100  # a step every tick: renew, register, look at the master key
# While no master is known, the election's steps run this often: the claim follows election_wait_ms
# by one step, and the other members see the new master a step after it claimed (their receivers,
# which a SYNC master waits for, start then)
ELECTION_TICK_MS = 20
LEASE_FILE = "lease"  # in the run directory: the member's etcd lease, kept over a restart of this actor
_control_reply = msgspec.msgpack.Decoder(ControlReply)


class BrokerMembershipActor(Actor):
    """Talks to etcd only, off its loop; tells the supervisor ``RoleChanged``."""

    tick_interval_ms = FOLLOW_TICK_MS  # ELECTION_TICK_MS while no master is known

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        cfg = env.config
        coordination = env.coordination
        self.etcd: Etcd = coordination.etcd(cfg) if coordination else Etcd(
            cfg.etcd_endpoint_list, timeout_ms=cfg.etcd_request_timeout_ms, tls=EtcdTls.of(cfg),
            login=EtcdLogin.of(cfg))
        self.keys = BrokerSetKeys(cfg.cluster_name, cfg.broker_name)
        self.routes = RoutePublisher(self.etcd, cfg.cluster_name, cfg.broker_name, env.store_dir)
        self.role = Role.load(env.run_dir)
        self.lease = 0
        self.renewed_ms = 0  # when the last renewal that etcd answered was sent
        self.master_revision = 0  # the create_revision of the master key, while this engine holds it
        self.offered_epoch = 0
        self.offered_ms = 0
        self.member_put_ms = 0
        self.mirrored_ms = -(1 << 62)  # when the cluster's routes were last mirrored
        self.mirrored: dict[str, object] | None = None
        self.acl_revision = 0  # the revision of the cluster's ACL in etcd last looked at
        self.audit: AuditLog | None = None
        self.published: list[int] | None = None
        self.waiting = ""  # why no master is elected, while none is
        self.etcd_down = ""
        self.elections_won = 0
        self.started = False  # a role taken (or resumed)
        self.start_end_offset = 0
        self.to_tell: Role | None = None  # a role the supervisor is to hear of (set by a step, told by the loop)
        self.calls = OffLoop(env.name, env.waker.wake, background=env.background)
        self.fence = AppendFence(env.run_dir / REPLICA_APPEND_LOCK)

    # -- start -------------------------------------------------------------

    def ports(self) -> list[Port]:
        return [Port(CONTROL, bind=False)]

    def handlers(self) -> dict[type, Handler]:
        return {ClientFrame: self.on_control_reply}

    def recover(self, out: Effects) -> None:
        """Nothing waits here: the steps take the role (``take_role``), the supervisor waits for it."""
        self.start_end_offset = self.log_end_offline() if self.role is None else 0

    def on_control_reply(self, _frame: ClientFrame, inbound: Inbound, out: Effects) -> None:
        reply = _control_reply.decode(inbound.payload)
        if not reply.ok:
            log.error("the supervisor refused the role: %s", reply.message)

    def tell(self, out: Effects) -> None:
        """What the last step decided, to the supervisor: the role it holds now."""
        if self.calls.take_done() and self.to_tell is not None:
            role, self.to_tell = self.to_tell, None
            out.append(Tell(CONTROL, None, encoder.encode(role.message()), lambda: None))

    def on_thread_wake(self, out: Effects) -> None:
        self.tell(out)

    def take_role(self) -> bool:
        """One try at the start: this engine's role resumed after a restart of this actor, or the
        one etcd gives it now. True once it has one."""
        try:
            if self.lease:  # kept alive while the start waits (an election may take longer than the lease)
                self.renew()
            else:
                self.lease = self.reuse_lease() or self.grant()
            if self.role is not None:  # this actor restarted: the engine runs in its role
                self.resume()
                self.started = True
            else:
                role = self.decide(self.start_end_offset)
                if role is not None:
                    self.hold(role)
                    self.started = True
                    self.to_tell = role
        except EtcdUnavailable as exc:
            self.waiting = str(exc)
        return self.started

    def reuse_lease(self) -> int:
        try:
            lease = int((self.env.run_dir / LEASE_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return 0
        sent_ms = self.clock.mono_ms()
        if not self.etcd.keep_alive(lease):
            return 0
        self.renewed_ms = sent_ms
        return lease

    def grant(self) -> int:
        self.renewed_ms = self.clock.mono_ms()
        lease = self.etcd.grant(self.config.master_lease_ms)
        write_atomically(self.env.run_dir / LEASE_FILE, str(lease).encode())
        self.member_put_ms = 0
        return lease

    def resume(self) -> None:
        assert self.role is not None
        if self.role.is_master:
            master = self.etcd.get(self.keys.master)
            if master is not None and master.lease == self.lease and master.value["epoch"] == self.role.epoch:
                self.master_revision = master.create_revision
                self.fence_until(self.renewed_ms + self.config.master_lease_ms - self.config.master_fence_margin_ms)
            # else: lost while this actor was down; the first tick steps down
        self.slots.set(EPOCH, self.role.epoch)

    def log_end_offline(self) -> int:
        """The log's end before the writer runs (the engine's start): the writer's own recovery plan."""
        return plan_commit_log_recovery(self.env.store_dir, self.config, unclean=True).end_offset

    # -- the role ------------------------------------------------------------

    def decide(self, end_offset: int) -> Role | None:
        """The role etcd gives this engine now: a replica of the master there, or master by an
        election this engine won; None while no master is elected."""
        master = self.etcd.get(self.keys.master)
        if master is not None and master.value["broker_id"] == self.config.broker_id:
            # This engine's master key from an earlier run (or lease): it is not master now.
            self.etcd.transaction([created_at(self.keys.master, master.create_revision)],
                                  [delete(self.keys.master)])
            return None
        if master is not None:
            return self.replica_of(master)
        return self.elect(end_offset)

    def replica_of(self, master: Entry) -> Role:
        value = master.value
        return Role("replica", value["epoch"], value["broker_id"], value["endpoint"], value["replication_endpoint"],
                    history(self.etcd.get_prefix(self.keys.epochs)), value.get("grpc_endpoint", ""))

    def elect(self, end_offset: int) -> Role | None:
        """One step of an election: offer this log's end, and after ``election_wait_ms`` claim if it
        is the best offer of the in-sync set's members."""
        epochs = history(self.etcd.get_prefix(self.keys.epochs))
        epoch = (epochs[-1][0] if epochs else 0) + 1
        in_sync = self.etcd.get(self.keys.in_sync)
        members = in_sync.value["members"] if in_sync is not None else None
        me = self.config.broker_id
        if members is not None and me not in members:
            self.waiting = f"no master; one of the in-sync set {members} must be elected (this is broker {me})"
            return None
        now_ms = self.clock.mono_ms()
        if self.offered_epoch != epoch or now_ms - self.offered_ms > 2 * self.config.master_lease_ms:
            self.etcd.put(self.keys.offer(epoch, me), {"end_offset": end_offset}, lease=self.lease)
            self.offered_epoch, self.offered_ms = epoch, now_ms
            self.waiting = f"no master; offered this log (end {end_offset}) for epoch {epoch}"
            return None
        if now_ms - self.offered_ms < self.config.election_wait_ms:
            return None
        offers = {int(entry.key.rsplit("/", 1)[-1]): int(entry.value["end_offset"])
                  for entry in self.etcd.get_prefix(self.keys.offers(epoch))}
        offers = {broker_id: end for broker_id, end in offers.items() if members is None or broker_id in members}
        offers[me] = end_offset
        if choose(offers) != me:
            self.waiting = f"no master; broker {choose(offers)} has the longest log for epoch {epoch}"
            return None
        return self.claim(epoch, end_offset, in_sync, epochs)

    def claim(self, epoch: int, end_offset: int, in_sync: Entry | None, epochs: list[tuple[int, int]]) -> Role | None:
        """Become master of ``epoch`` by etcd's transaction, if nobody else did meanwhile."""
        me = self.config.broker_id
        sent_ms = self.clock.mono_ms()
        if not self.etcd.keep_alive(self.lease):  # renewed just before: the fence starts from it
            self.lease = self.grant()
            return None
        master = {"broker_id": me, "epoch": epoch, "endpoint": self.config.advertised_endpoint,
                  "replication_endpoint": self.config.replication_endpoint,
                  "grpc_endpoint": self.config.grpc_endpoint if self.config.grpc_enabled else ""}
        held_epoch = self.slots.get(EPOCH)
        if self.started:  # a running replica: no chunk of the old follow lands past the end it claims at
            with self.fence.held():  # the writer appends only a chunk of the epoch slot's follow (append_fence.py)
                self.slots.set(EPOCH, epoch)
                end_offset = self.slots.get(WRITTEN)
        compare, success = self.keys.claim(epoch=epoch, in_sync=in_sync, master=master, start_offset=end_offset,
                                           lease=self.lease)
        won = False
        try:
            won = self.etcd.transaction(compare, success)
        finally:
            if not won:
                self.slots.set(EPOCH, held_epoch)  # the old follow goes on (its next chunk, if refused, is asked again)
        if not won:
            return None
        self.renewed_ms = sent_ms
        self.master_revision = self.etcd.get(self.keys.master).create_revision  # type: ignore[union-attr]
        self.elections_won += 1
        log.warning("elected master of %s for epoch %d (log end %d)", self.config.broker_name, epoch, end_offset,
                    extra=event("election.won", epoch=epoch, end_offset=end_offset))
        return Role("master", epoch, me, self.config.advertised_endpoint, self.config.replication_endpoint,
                    [*epochs, (epoch, end_offset)])

    def hold(self, role: Role) -> None:
        """Hold ``role``: the file the supervisor reads, the slots the other actors read."""
        self.role = role
        self.waiting = ""
        self.published = None
        role.save(self.env.run_dir)
        self.slots.set(EPOCH, role.epoch)
        if role.is_master:
            self.fence_until(self.renewed_ms + self.config.master_lease_ms - self.config.master_fence_margin_ms)
            self.slots.set(IN_SYNC_PUBLISHED, mask([role.master_id]))
        else:
            self.fence_until(0)
            self.master_revision = 0
            write_atomically(self.env.run_dir / MASTER_ENDPOINT_FILE, role.master_endpoint.encode())
        log.info("role: %s of epoch %d (master: broker %d at %s)", role.role, role.epoch, role.master_id,
                 role.master_endpoint, extra=event("membership.role", role=role.role, epoch=role.epoch))

    def change(self, role: Role) -> None:
        self.hold(role)
        self.to_tell = role

    def fence_until(self, deadline_ms: int) -> None:
        self.slots.set(LEASE_DEADLINE, deadline_ms)

    # -- every tick ----------------------------------------------------------

    def tick(self, out: Effects) -> None:
        self.tell(out)  # the last step's outcome first: the next step may decide again
        self.calls.submit(self.step)
        self.tell(out)  # without a background the step ran already

    def step(self) -> None:
        """One step of etcd's requests, off the loop: a role looked for, or the lease renewed and the
        role held or followed."""
        if not self.started:
            self.take_role()
            return
        try:
            self.renew()
            self.register()
            if self.role is not None and self.role.is_master:
                self.tick_interval_ms = FOLLOW_TICK_MS  # elected: no more election steps
                self.hold_master()
            else:
                self.follow()
            self.mirror_routes()
            self.etcd_down = ""
        except EtcdUnavailable as exc:
            if not self.etcd_down:
                log.error("etcd out of reach: %s", exc, extra=event("membership.etcd_down"))
            self.etcd_down = str(exc)

    def renew(self) -> None:
        now_ms = self.clock.mono_ms()
        if now_ms - self.renewed_ms < self.config.master_lease_ms // 4:
            return
        if self.etcd.keep_alive(self.lease):
            self.renewed_ms = now_ms
            if self.role is not None and self.role.is_master and self.master_revision:
                self.fence_until(now_ms + self.config.master_lease_ms - self.config.master_fence_margin_ms)
            return
        log.warning("the lease expired", extra=event("membership.lease_expired"))
        self.fence_until(0)
        self.lease = self.grant()  # the master key went with the old one: the next step sees it

    def register(self) -> None:
        now_ms = self.clock.mono_ms()
        if now_ms - self.member_put_ms < 1_000:
            return
        self.member_put_ms = now_ms
        self.etcd.put(self.keys.member(self.config.broker_id),
                      {"broker_id": self.config.broker_id, "endpoint": self.config.advertised_endpoint,
                       "replication_endpoint": self.config.replication_endpoint,
                       "end_offset": self.slots.get(WRITTEN)}, lease=self.lease)

    def hold_master(self) -> None:
        assert self.role is not None
        master = self.etcd.get(self.keys.master)
        if master is None or master.create_revision != self.master_revision:
            self.fence_until(0)
            log.warning("no longer master of epoch %d", self.role.epoch,
                        extra=event("membership.stepped_down", epoch=self.role.epoch))
            self.master_revision = 0
            self.routes.stepped_down()
            if master is not None and master.value["broker_id"] != self.config.broker_id:
                self.change(self.replica_of(master))
            else:  # no master yet: fenced, this engine joins the election on the next ticks
                self.hold(Role("replica", self.role.epoch, -1, "", "", self.role.history))
            return
        members = sorted({self.config.broker_id, *members_of(self.slots.get(IN_SYNC_IDS))})
        if members != self.published:
            compare, success = self.keys.publish_in_sync(master_revision=self.master_revision,
                                                         epoch=self.role.epoch, members=members)
            if self.etcd.transaction(compare, success):
                self.published = members
                self.slots.set(IN_SYNC_PUBLISHED, mask(members))
                log.info("in-sync set %s published", members, extra=event("membership.in_sync", members=members))
        self.routes.publish()

    def follow(self) -> None:
        assert self.role is not None
        master = self.etcd.get(self.keys.master)
        self.tick_interval_ms = ELECTION_TICK_MS if master is None else FOLLOW_TICK_MS
        if master is None:
            role = self.elect(self.slots.get(WRITTEN))
            if role is not None:
                self.change(role)
            return
        value = master.value
        if (value["broker_id"], value["epoch"]) != (self.role.master_id, self.role.epoch):
            if value["broker_id"] == self.config.broker_id:  # a key of this engine's earlier life
                self.decide(self.slots.get(WRITTEN))
                return
            self.change(self.replica_of(master))

    def mirror_routes(self) -> None:
        """Every ``cluster_routes_refresh_ms``, the cluster's routes into the run directory, for the front."""
        now_ms = self.clock.mono_ms()
        if now_ms - self.mirrored_ms < self.config.cluster_routes_refresh_ms:
            return
        self.mirrored_ms = now_ms
        routes = read_cluster(self.etcd, self.config.cluster_name)
        if routes != self.mirrored:
            write_atomically(self.env.run_dir / ROUTES_MIRROR_FILE, json.dumps(routes).encode())
            self.mirrored = routes
        self.mirror_acl()

    def mirror_acl(self) -> None:
        """A new revision of the cluster's users and policies in etcd (``cluster_acl.py``) into this
        store's ``config/acl.json``, and each change made since, to the audit log; none in etcd: the
        store's own."""
        entry = read_acl(self.etcd, self.config.cluster_name)
        if entry is None or entry.mod_revision == self.acl_revision:
            return
        try:
            acl = acl_of(entry)
        except (AclError, msgspec.ValidationError, KeyError, TypeError) as exc:
            self.acl_revision = entry.mod_revision
            log.error("the cluster's ACL in etcd (revision %d) cannot be used; this engine keeps its own: %s",
                      entry.mod_revision, exc, extra=event("membership.acl_refused"))
            return
        current = load_acl(self.env.store_dir)
        if current is None or current.file != acl:
            save_acl(self.env.store_dir, acl)
            log.info("took the cluster's ACL of etcd revision %d", entry.mod_revision, extra=event("membership.acl"))
        for change in changes_after(self.etcd, self.config.cluster_name, self.env.store_dir):
            if self.audit is None:
                cfg = self.config
                self.audit = AuditLog(self.env.store_dir / LOG_DIR / f"audit-{self.env.name}.jsonl",
                                      bytes_max=cfg.audit_log_bytes_max, files_kept=cfg.audit_log_files_kept)
            fields = change.value if isinstance(change.value, dict) else {}
            self.audit.record("admin", **{**fields, "op": f"{fields.get('op', 'acl change')} (cluster, etcd)",
                                          "revision": change.mod_revision})
            mark_audited(self.env.store_dir, change)
        self.acl_revision = entry.mod_revision

    # -- reports -------------------------------------------------------------

    def detail(self) -> dict[str, int]:
        deadline = self.slots.get(LEASE_DEADLINE)
        return {"epoch": self.slots.get(EPOCH), "master": int(bool(self.role and self.role.is_master)),
                "lease_left_ms": max(0, deadline - self.clock.mono_ms()) if deadline else 0,
                "in_sync_published": self.slots.get(IN_SYNC_PUBLISHED), "elections_won": self.elections_won}

    def condition(self) -> str:
        if not self.started and self.role is None:  # one restarted holds its role meanwhile
            return f"no role yet: {self.waiting or 'etcd did not answer'}"
        if self.etcd_down:
            return f"etcd out of reach: {self.etcd_down}"
        return self.waiting if self.role is not None and self.role.master_id < 0 else ""

    def shutdown(self, out: Effects) -> None:
        self.calls.close()


if __name__ == "__main__":
    raise SystemExit(main(BrokerMembershipActor))
