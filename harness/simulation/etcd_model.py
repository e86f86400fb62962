"""A model of etcd for the simulation only: one linearizable key-value store with revisions and
leases, on the simulation's clock, that any party may be cut off from.

It answers the requests of etcd's JSON gateway that ``engine/coordination/etcd.py`` sends
(``/kv/range``, ``/kv/put``, ``/kv/txn``, ``/lease/grant``, ``/lease/keepalive``,
``/lease/revoke``), so the broker membership actor runs its own code against it: only the
transport is replaced (``ModelClient``). What it keeps of etcd's contract, and nothing more:

* one revision counter, raised by each put, delete or transaction that changes something;
  a key keeps the revision it was created at and the one it was last changed at;
* a transaction compares, then applies its success or failure requests at once;
* a lease expires ``TTL`` seconds after its grant or last keep-alive, and every key attached
  to it goes with it (at one revision); a keep-alive of an expired lease answers no TTL;
* a party cut off from etcd (``partitioned``) gets ``EtcdUnavailable``, as a client gets when
  no endpoint answers. A request either happens whole or not at all: the model never applies
  one whose answer is lost (etcd can; the membership actor's requests are idempotent or
  compare revisions, so a lost answer only looks like an unreachable etcd here).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.actors.base import Clock
from engine.coordination.etcd import Etcd, EtcdUnavailable


class LeaseNotFound(RuntimeError):
    """etcd's answer to a put on a lease that expired (the gateway's 404)."""


@dataclass
class _Value:
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


class EtcdModel:
    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()  # the simulation's, once its first engine has one
        self.revision = 1
        self.kv: dict[bytes, _Value] = {}
        self.leases: dict[int, tuple[int, int]] = {}  # id -> (TTL in ms, expiry on the clock)
        self.next_lease = 0x1000
        self.partitioned: Callable[[str], bool] = lambda party: False
        self.requests = 0

    def serve(self, party: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.partitioned(party):
            raise EtcdUnavailable(f"etcd is cut off from {party}")
        self.requests += 1
        self.expire()
        handlers = {"/kv/range": self.range, "/kv/put": self.put, "/kv/txn": self.txn, "/lease/grant": self.grant,
                    "/lease/keepalive": self.keep_alive, "/lease/revoke": self.revoke_request}
        return handlers[path](body)

    def put(self, body: dict[str, Any]) -> dict[str, Any]:
        self.apply([{"request_put": body}])
        return {}

    def txn(self, body: dict[str, Any]) -> dict[str, Any]:
        succeeded = all(self.holds(compare) for compare in body["compare"])
        self.apply(body["success"] if succeeded else body.get("failure", []))
        return {"succeeded": succeeded}

    def grant(self, body: dict[str, Any]) -> dict[str, Any]:
        self.next_lease += 1
        ttl_ms = int(body["TTL"]) * 1000
        self.leases[self.next_lease] = (ttl_ms, self.clock.mono_ms() + ttl_ms)
        return {"ID": str(self.next_lease), "TTL": body["TTL"]}

    def keep_alive(self, body: dict[str, Any]) -> dict[str, Any]:
        lease = int(body["ID"])
        if lease not in self.leases:
            return {"result": {"ID": body["ID"]}}  # expired: no TTL
        ttl_ms, _ = self.leases[lease]
        self.leases[lease] = (ttl_ms, self.clock.mono_ms() + ttl_ms)
        return {"result": {"ID": body["ID"], "TTL": str(ttl_ms // 1000)}}

    def revoke_request(self, body: dict[str, Any]) -> dict[str, Any]:
        self.revoke(int(body["ID"]))
        return {}

    def expire(self) -> None:
        now_ms = self.clock.mono_ms()
        for lease in sorted(lease for lease, (_, expiry) in self.leases.items() if expiry <= now_ms):
            self.revoke(lease)

    def revoke(self, lease: int) -> None:
        self.leases.pop(lease, None)
        attached = [key for key, value in self.kv.items() if value.lease == lease]
        if attached:
            self.revision += 1
            for key in attached:
                del self.kv[key]

    def range(self, body: dict[str, Any]) -> dict[str, Any]:
        start = base64.b64decode(body["key"])
        end = base64.b64decode(body["range_end"]) if "range_end" in body else None
        keys = sorted(key for key in self.kv if (key == start if end is None else start <= key < end))
        return {"kvs": [{"key": base64.b64encode(key).decode(),
                         "value": base64.b64encode(self.kv[key].value).decode(),
                         "create_revision": str(self.kv[key].create_revision),
                         "mod_revision": str(self.kv[key].mod_revision), "lease": str(self.kv[key].lease)}
                        for key in keys]}

    def holds(self, compare: dict[str, Any]) -> bool:
        assert compare["result"] == "EQUAL", compare
        value = self.kv.get(base64.b64decode(compare["key"]))
        if compare["target"] == "CREATE":
            return (value.create_revision if value else 0) == int(compare["create_revision"])
        assert compare["target"] == "MOD", compare
        return (value.mod_revision if value else 0) == int(compare["mod_revision"])

    def apply(self, requests: list[dict[str, Any]]) -> None:
        """Every request at the next revision, or none (a put on a lease that is gone)."""
        for request in requests:
            lease = int(request.get("request_put", {}).get("lease", 0))
            if lease and lease not in self.leases:
                raise LeaseNotFound(f"etcd: requested lease not found ({lease:x})")
        if not requests:
            return
        self.revision += 1
        for request in requests:
            if "request_put" in request:
                put = request["request_put"]
                key = base64.b64decode(put["key"])
                old = self.kv.get(key)
                self.kv[key] = _Value(base64.b64decode(put["value"]), old.create_revision if old else self.revision,
                                      self.revision, int(put.get("lease", 0)))
            else:
                self.kv.pop(base64.b64decode(request["request_delete_range"]["key"]), None)

    def get(self, key: str) -> Any:
        """A key's JSON value as a party outside the simulation sees it (the checks, the client's route)."""
        self.expire()
        value = self.kv.get(key.encode())
        return json.loads(value.value) if value else None

    def get_prefix(self, prefix: str) -> dict[str, Any]:
        self.expire()
        return {key.decode(): json.loads(value.value) for key, value in sorted(self.kv.items())
                if key.startswith(prefix.encode())}


class ModelClient(Etcd):
    """``Etcd`` with the model in place of the gateway's HTTP: the same requests, answered by it."""

    def __init__(self, model: EtcdModel, party: str) -> None:  # no super().__init__: no HTTP client
        self.model = model
        self.party = party

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.model.serve(self.party, path, body)
