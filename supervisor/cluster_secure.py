"""``cluster start`` (unless ``--insecure``): what a cluster on this machine needs to keep strangers out, made in
``D/secrets`` (mode 0700; every key 0600) before anything starts (docs/security.md, "A secure
cluster on one machine")::

    D/secrets/
      ca.pem  ca.key                     the cluster's CA (engine/security/authority.py)
      etcd.pem  etcd.key                 every etcd member's certificate: client URLs and peers, TLS only,
                                         asking each caller for a certificate the CA signed
      <engine>-etcd.pem  .key            an engine's certificate to etcd (OU: the engine's name)
      <engine>/etcd-password             its etcd user's password (the user: the engine's name)
      operator-etcd.pem  .key            the operator's, for `cluster status` and the CLI
      operator-etcd-password             etcd user operator's password
      etcd-root-password                 etcd user root's (etcd's own administration only)
      engines.key  engines.key_secret    the client port's CURVE key, one for every engine (a client
                                         follows its set's master from engine to engine)
      clients/admin.key                  the client keys let in (curve_authorized_keys_dir)
      admin.key_secret                   the admin user's CURVE key pair
      admin.json                         the admin user's credentials (rmqpy.Credentials, --credentials):
                                         its AccessKey and SecretKey, its CURVE key, the engines' public
                                         key, and the operator's way into etcd
      <engine>/replication.key_secret    the engine's own replication key pair
      <broker>-members/member-<id>.key   its set's members' public replication keys

Every engine runs with ``curve_enabled`` and ``acl_enabled``; its ACL (``config/acl.json``)
starts with one user, ``admin`` (super), known by its CURVE key and its AccessKey, and takes the
cluster's from etcd (``rmqpy acl --cluster``: every set at once). etcd runs with its own auth on:
each engine and the operator are etcd users whose one role (``rmqpy-<cluster>``) may read and
write the cluster's keys and nothing else; ``root`` administers etcd itself. Nothing is ever
overwritten: a directory that has its secrets keeps them (``cluster add`` signs with the same CA
and adds its engines' etcd users as root).
"""

from __future__ import annotations

import getpass
import json
import os
import secrets
import shutil
from dataclasses import asdict
from pathlib import Path

from engine.coordination.cluster_acl import change_acl, read_acl
from engine.coordination.etcd import Etcd, EtcdLogin, EtcdRefused, EtcdTls, prefix_range
from engine.coordination.routes import routes_prefix
from engine.ipc.curve import keygen, member_key_file, public_key_of
from engine.security.acl import ACL_FILE, AclFile, User, save
from engine.security.authority import LOOPBACK_NAMES, Authority, Issued

SECRETS_DIR = "secrets"
ADMIN = "admin"
ADMIN_FILE = "admin.json"
OPERATOR = "operator"  # etcd's user for the operator's commands


def _write_secret(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text + "\n")


def _add_user(etcd: Etcd, name: str, password_file: Path, role: str) -> None:
    """etcd's user ``name`` with the password of the file and ``role`` (kept if it exists)."""
    try:
        etcd.request("/auth/user/add", {"name": name, "password": password_file.read_text().strip()})
    except EtcdRefused as exc:
        if "already exists" not in str(exc):
            raise
    etcd.request("/auth/user/grant", {"user": name, "role": role})


class SecureCluster:
    def __init__(self, directory: Path) -> None:
        self.root = directory / SECRETS_DIR
        self.authority = Authority.open(self.root) if (self.root / "ca.key").exists() else None

    @property
    def made(self) -> bool:
        return self.authority is not None

    def create(self) -> None:
        """The CA, etcd's certificates, the client port's key and the admin user (once)."""
        if self.authority is not None:
            return
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        authority = Authority.create(self.root, "rmqpy cluster CA")
        authority.issue("etcd", hosts=LOOPBACK_NAMES, common_name=False)
        authority.issue("operator", file_name="operator-etcd", common_name=False)
        for user in ("etcd-root", "operator-etcd"):
            _write_secret(self.root / f"{user}-password", secrets.token_urlsafe(24))
        keygen(self.root, "engines")
        admin_public, admin_secret = keygen(self.root, ADMIN)
        (self.root / "clients").mkdir(mode=0o700)
        shutil.move(admin_public, self.root / "clients" / f"{ADMIN}.key")
        _write_secret(self.root / ADMIN_FILE, json.dumps({
            "user": ADMIN, "access_key": ADMIN, "secret_key": secrets.token_urlsafe(24),
            "curve_secret_key_file": str(admin_secret), "server_public_key_file": str(self.root / "engines.key"),
            "etcd": {**asdict(self.operator_tls()), **asdict(self.operator_login())}}, indent=2))
        self.authority = authority

    def member_tls(self) -> EtcdTls:
        """What etcd's members serve with."""
        return EtcdTls(str(self.root / "ca.pem"), str(self.root / "etcd.pem"), str(self.root / "etcd.key"))

    def operator_tls(self) -> EtcdTls:
        return EtcdTls(str(self.root / "ca.pem"), str(self.root / "operator-etcd.pem"),
                       str(self.root / "operator-etcd.key"))

    def operator_login(self) -> EtcdLogin:
        return EtcdLogin(OPERATOR, str(self.root / "operator-etcd-password"))

    def etcd_users(self, endpoints: str, cluster_name: str, engines: list[str]) -> None:
        """etcd's own users. The first time (etcd's auth off): ``root``, a role that may read and
        write the cluster's keys only, ``operator`` and each engine with that role, then auth on.
        Later (a restart, ``cluster add``), as root: the engines' users it lacks."""
        urls = endpoints.split(",")
        etcd = Etcd(urls, timeout_ms=3_000, tls=self.operator_tls())
        try:
            etcd.request("/auth/user/list", {})  # answered to anyone only while etcd's auth is off
            first = True
        except EtcdRefused:
            etcd = Etcd(urls, timeout_ms=3_000, tls=self.operator_tls(),
                        login=EtcdLogin("root", str(self.root / "etcd-root-password")))
            first = False
        role = f"rmqpy-{cluster_name}"
        if first:
            _add_user(etcd, "root", self.root / "etcd-root-password", "root")
            etcd.request("/auth/role/add", {"name": role})
            for prefix in (f"/rmqpy/{cluster_name}/", routes_prefix(cluster_name)):
                etcd.request("/auth/role/grant", {"name": role, "perm": {"permType": "READWRITE",
                                                                          **prefix_range(prefix)}})
        _add_user(etcd, OPERATOR, self.root / "operator-etcd-password", role)
        for name in engines:
            _add_user(etcd, name, self.root / name / "etcd-password", role)
        if first:
            etcd.request("/auth/enable", {})

    def admin(self) -> dict[str, str]:
        admin: dict[str, str] = json.loads((self.root / ADMIN_FILE).read_text())
        return admin

    def engine_settings(self, name: str, broker_name: str, broker_id: int, *, etcd: bool = True) -> dict[str, object]:
        """The engine's replication key pair (its public key among its set's members'), with ``etcd``
        its certificate and user there, and the settings that use them."""
        assert self.authority is not None, "create() first"
        certificate = Issued(self.root / f"{name}-etcd.pem", self.root / f"{name}-etcd.key")
        if etcd and not certificate.key_file.exists():  # a cluster started again keeps its engines' keys
            self.authority.issue(name, file_name=f"{name}-etcd", common_name=False)
        public, secret = self.root / name / "replication.key", self.root / name / "replication.key_secret"
        if not secret.exists():
            keygen(self.root / name, "replication")
        password = self.root / name / "etcd-password"
        if etcd and not password.exists():
            _write_secret(password, secrets.token_urlsafe(24))
        members = self.root / f"{broker_name}-members"
        members.mkdir(mode=0o700, exist_ok=True)
        shutil.copyfile(public, member_key_file(members, broker_id))
        settings: dict[str, object] = {
            "curve_enabled": True, "curve_server_secret_key_file": str(self.root / "engines.key_secret"),
            "curve_authorized_keys_dir": str(self.root / "clients"), "acl_enabled": True,
            "replication_curve_secret_key_file": str(secret), "replication_curve_authorized_keys_dir": str(members),
            "etcd_tls_ca_file": str(self.root / "ca.pem"), "etcd_tls_cert_file": str(certificate.cert_file),
            "etcd_tls_key_file": str(certificate.key_file), "etcd_user": name, "etcd_password_file": str(password)}
        if not etcd:
            settings = {key: value for key, value in settings.items() if not key.startswith("etcd_")}
        return settings

    def admin_acl(self) -> AclFile:
        admin = self.admin()
        return AclFile(users={ADMIN: User(
            super=True, access_key=admin["access_key"], secret_key=admin["secret_key"],
            curve_public_key=public_key_of(self.root / "clients" / f"{ADMIN}.key"))})

    def seed_acl(self, store_dir: Path) -> None:
        """The engine's first ACL: the admin user, a super user (``rmqpy acl`` adds the others); an
        engine that has an ACL keeps it."""
        if not (store_dir / ACL_FILE).exists():
            save(store_dir, self.admin_acl())

    def seed_cluster_acl(self, endpoints: str, cluster_name: str) -> None:
        """The cluster's ACL in etcd, which every engine takes (``cluster_acl.py``): the admin user,
        unless the cluster has one already."""
        etcd = Etcd(endpoints.split(","), timeout_ms=3_000, tls=self.operator_tls(), login=self.operator_login())
        if read_acl(etcd, cluster_name) is None:
            change_acl(etcd, cluster_name, lambda _none: (self.admin_acl(), {
                "op": "acl made by cluster start", "subject": getpass.getuser(), "source": "cli",
                "resource": f"user:{ADMIN}", "action": "super"}))
