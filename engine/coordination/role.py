"""The role an engine elected on etcd runs in, as the broker membership actor writes it to the run
directory (``role.json``) for the supervisor, the front and the gRPC endpoint; and the broker ids
of an in-sync set as the bits of a shared slot. Nothing here talks to etcd (``broker_set.py``
does), so the processes that only read the role do not load its client.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.ipc.messages import RoleChanged

ROLE_FILE = "role.json"


@dataclass(frozen=True)
class Role:
    role: str  # "master" or "replica"
    epoch: int
    master_id: int
    master_endpoint: str = ""  # where the master's clients reach it
    master_replication_endpoint: str = ""
    history: list[tuple[int, int]] = field(default_factory=list)  # (epoch, start offset) of the set
    master_grpc_endpoint: str = ""  # host:port of the master's gRPC endpoint ("" : none)

    @property
    def is_master(self) -> bool:
        return self.role == "master"

    def save(self, run_dir: Path) -> None:
        tmp = run_dir / (ROLE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(run_dir / ROLE_FILE)

    def message(self) -> RoleChanged:
        """The role as the membership actor tells it to the supervisor."""
        return RoleChanged(self.role, self.epoch, self.master_id, self.master_endpoint,
                           self.master_replication_endpoint, list(self.history), self.master_grpc_endpoint)

    @classmethod
    def of(cls, told: RoleChanged) -> Role:
        return cls(told.role, told.epoch, told.master_id, told.master_endpoint, told.master_replication_endpoint,
                   [(epoch, start) for epoch, start in told.history], told.master_grpc_endpoint)

    @classmethod
    def load(cls, run_dir: Path) -> Role | None:
        try:
            data = json.loads((run_dir / ROLE_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None
        data["history"] = [tuple(pair) for pair in data.get("history", [])]
        return cls(**data)


def mask(members: list[int]) -> int:
    """broker ids as the bits of a shared slot."""
    bits = 0
    for broker_id in members:
        bits |= 1 << broker_id
    return bits


def members_of(bits: int) -> list[int]:
    return [broker_id for broker_id in range(63) if bits >> broker_id & 1]
