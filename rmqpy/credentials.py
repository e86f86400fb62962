"""What a client shows a secure cluster, read from the file ``cluster start`` writes for its admin
user (``DIR/secrets/admin.json``, its owner's only; docs/security.md)::

    {"user": "admin", "access_key": "admin", "secret_key": "...",       the gRPC port's signature
     "curve_secret_key_file": ".../admin.key_secret",                 the client port's CURVE key
     "server_public_key_file": ".../engines.key",                     the engines' public key
     "etcd": {"ca_file", "cert_file", "key_file",                     etcd over https
              "user", "password_file"}}                                etcd's own user

    credentials = Credentials.load("cluster/secrets/admin.json")
    with Producer("tcp://127.0.0.1:10911,tcp://127.0.0.1:10921", curve=credentials.curve) as producer:
        ...
    cluster = credentials.cluster("https://127.0.0.1:2379")          # routes from etcd, over TLS

Relative paths in the file are taken from the file's directory. A file for another user is made
the same way: its CURVE key pair (``rmqpy keygen``), its public key in the engines'
``curve_authorized_keys_dir``, and the user in the ACL (``rmqpy acl user add``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.coordination.etcd import EtcdLogin, EtcdTls
from engine.ipc.curve import CurveKeys
from rmqpy.cluster import Cluster

__all__ = ["Credentials"]


@dataclass(frozen=True)
class Credentials:
    user: str
    curve: CurveKeys
    access_key: str = ""
    secret_key: str = ""
    etcd_tls: EtcdTls | None = None
    etcd_login: EtcdLogin | None = None

    @classmethod
    def load(cls, path: str | Path) -> Credentials:
        """The credentials in ``path``; ValueError naming what is missing or unreadable."""
        path = Path(path)
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            where = path.resolve().parent

            def file(name: str) -> str:
                return str(where / Path(data[name]).expanduser())

            curve = CurveKeys.from_files(file("server_public_key_file"), file("curve_secret_key_file"))
            etcd = data.get("etcd") or {}
            tls = EtcdTls(*(str(where / etcd[key]) for key in ("ca_file", "cert_file", "key_file"))) \
                if etcd.get("ca_file") else None
            login = EtcdLogin(etcd["user"], str(where / etcd["password_file"])) if etcd.get("user") else None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} holds no usable credentials: {exc!r}") from None
        return cls(str(data.get("user", "")), curve, str(data.get("access_key", "")), str(data.get("secret_key", "")),
                   tls, login)

    def cluster(self, address: str | Iterable[str], **options: Any) -> Cluster:
        """The cluster at ``address`` (etcd's endpoints, or an engine), reached with these credentials."""
        return Cluster(address, etcd_tls=self.etcd_tls, etcd_login=self.etcd_login, curve=self.curve, **options)
