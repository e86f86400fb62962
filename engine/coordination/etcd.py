"""etcd, reached through its JSON gateway (``etcd3gw``), over every endpoint of the etcd cluster.

etcd keeps the broker set's election state (``broker_set.py``): it is the distributed engine that
agrees, so nothing here agrees on anything itself. A request goes to the endpoint that answered
last; one that cannot be reached (a member down) is left for the next, in turn, and
``EtcdUnavailable`` is raised only when none answers. Keys and values are bytes on the wire
(base64 in the gateway's JSON); here they are ``str`` keys and JSON values.
"""

from __future__ import annotations

import base64
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import etcd3gw
from etcd3gw import exceptions as etcd_errors

from engine.config import StoreConfig


class EtcdUnavailable(RuntimeError):
    """No endpoint of the etcd cluster answered."""


class EtcdRefused(EtcdUnavailable):
    """etcd answered no: a user it does not know, a wrong password, or a key outside the user's
    role. Nothing a retry changes; the engine keeps trying (an operator may fix the user meanwhile)."""


@dataclass(frozen=True)
class EtcdLogin:
    """etcd's own user (etcd with auth enabled): its name and the file holding its password. Each
    request carries the token etcd gave for them, asked again when etcd no longer knows it (a
    member restarted, the token unused for ``--auth-token-ttl``). What the user may touch is its
    roles' key ranges (``cluster start``: the cluster's prefix only)."""
    user: str
    password_file: str

    @classmethod
    def of(cls, config: StoreConfig) -> EtcdLogin | None:
        return cls(config.etcd_user, config.etcd_password_file) if config.etcd_user else None

    def password(self) -> str:
        return Path(self.password_file).read_text().strip()


@dataclass(frozen=True)
class EtcdTls:
    """TLS to etcd's client URLs (``https://``): the CA that signed the members' certificates, and
    this client's certificate and key, which etcd (``--client-cert-auth``) asks for: without them
    no request is made at all."""
    ca_file: str
    cert_file: str
    key_file: str

    @classmethod
    def of(cls, config: StoreConfig) -> EtcdTls | None:
        """The engine's TLS to etcd (``etcd_tls_*``), or None."""
        if not config.etcd_tls_ca_file:
            return None
        return cls(config.etcd_tls_ca_file, config.etcd_tls_cert_file, config.etcd_tls_key_file)

    def context(self) -> ssl.SSLContext:
        """For ``urllib`` (health checks)."""
        context = ssl.create_default_context(cafile=self.ca_file)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


@dataclass(frozen=True)
class Entry:
    key: str
    value: Any  # the JSON value
    create_revision: int
    mod_revision: int
    lease: int


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode()


def _prefix_end(prefix: str) -> str:
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return _b64(bytes(raw))


def prefix_range(prefix: str) -> dict[str, str]:
    """Every key under ``prefix``, as etcd's requests name a range (a role's permission)."""
    return {"key": _b64(prefix), "range_end": _prefix_end(prefix)}


def put(key: str, value: Any, *, lease: int = 0) -> dict[str, Any]:
    """A put, for a transaction's success or failure list."""
    request: dict[str, Any] = {"key": _b64(key), "value": _b64(json.dumps(value, separators=(",", ":")))}
    if lease:
        request["lease"] = str(lease)
    return {"request_put": request}


def delete(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key)}}


def delete_before(prefix: str, end: str) -> dict[str, Any]:
    """A delete, for a transaction: the keys from ``prefix`` up to ``end`` (not included)."""
    return {"request_delete_range": {"key": _b64(prefix), "range_end": _b64(end)}}


def absent(key: str) -> dict[str, Any]:
    """A comparison: the key does not exist."""
    return {"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}


def created_at(key: str, revision: int) -> dict[str, Any]:
    """A comparison: the key exists and was created at ``revision`` (the same one, not a new one)."""
    return {"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": str(revision)}


def modified_at(key: str, revision: int) -> dict[str, Any]:
    """A comparison: the key was last changed at ``revision`` (0: it does not exist)."""
    return {"key": _b64(key), "result": "EQUAL", "target": "MOD", "mod_revision": str(revision)}


_TOKEN_GONE = ("invalid auth token", "user name is empty")  # etcd's words: ask for a token again
# An endpoint that did not answer (the next is tried); subclasses of Etcd3Exception, caught first
_UNREACHED = (etcd_errors.ConnectionFailedError, etcd_errors.ConnectionTimeoutError, etcd_errors.InternalServerError)


class _TokenGone(Exception):
    """etcd no longer knows the token a request showed."""


class Etcd:
    def __init__(self, endpoints: list[str], *, timeout_ms: int, tls: EtcdTls | None = None,
                 login: EtcdLogin | None = None) -> None:
        assert endpoints
        self.clients = []
        for url in endpoints:
            scheme, _, rest = url.partition("://")
            host, _, port = rest.rstrip("/").rpartition(":")
            self.clients.append(etcd3gw.Etcd3Client(
                host=host.strip("[]"), port=int(port), protocol=scheme, timeout=timeout_ms / 1000, api_path="/v3/",
                ca_cert=tls.ca_file if tls else None, cert_cert=tls.cert_file if tls else None,
                cert_key=tls.key_file if tls else None))
        # Given with each request: requests lets REQUESTS_CA_BUNDLE in the environment override a
        # session's own CA, and the members' CA is in no system bundle.
        self.verify: dict[str, str] = {"verify": tls.ca_file} if tls else {}
        self.login = login
        self.token = ""
        self.current = 0

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        for turn in range(len(self.clients)):
            client = self.clients[(self.current + turn) % len(self.clients)]
            try:
                reply = self._post(client, path, body)
            except _UNREACHED:
                continue
            self.current = (self.current + turn) % len(self.clients)
            return reply
        raise EtcdUnavailable(f"no etcd endpoint answered ({len(self.clients)} tried)")

    def _post(self, client: etcd3gw.Etcd3Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One request to one endpoint; with a login, under its token, asked for once more if etcd
        no longer knows it. EtcdRefused: etcd's no."""
        if self.login is not None and not self.token:
            self.token = self._authenticate(client, self.login)
        try:
            return self._send(client, path, body)
        except _TokenGone:
            assert self.login is not None
            self.token = self._authenticate(client, self.login)
            return self._send(client, path, body, token_gone_refused=True)

    def _send(self, client: etcd3gw.Etcd3Client, path: str, body: dict[str, Any], *,
              token_gone_refused: bool = False) -> dict[str, Any]:
        headers = {"Authorization": self.token} if self.token else {}
        try:
            reply: dict[str, Any] = client.post(client.get_url(path), json=body, headers=headers, **self.verify)
        except _UNREACHED:
            raise
        except etcd_errors.Etcd3Exception as exc:
            said = str(exc.detail_text or exc)
            if self.token and not token_gone_refused and any(words in said for words in _TOKEN_GONE):
                raise _TokenGone from None
            raise EtcdRefused(f"etcd refused {path}: {_message(said)}") from None
        return reply

    def _authenticate(self, client: etcd3gw.Etcd3Client, login: EtcdLogin) -> str:
        try:
            password = login.password()
        except OSError as exc:
            raise EtcdRefused(f"etcd user {login.user}: cannot read its password file: {exc}") from None
        try:
            reply = client.post(client.get_url("/auth/authenticate"), json={"name": login.user, "password": password},
                                **self.verify)
        except _UNREACHED:
            raise
        except etcd_errors.Etcd3Exception as exc:
            raise EtcdRefused(f"etcd user {login.user}: {_message(str(exc.detail_text or exc))}") from None
        return str(reply["token"])

    def request(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Any request of etcd's JSON gateway (``/auth/user/add``...): its reply."""
        return self._call(path, body)

    def get(self, key: str) -> Entry | None:
        kvs = self._call("/kv/range", {"key": _b64(key)}).get("kvs", [])
        return _entry(kvs[0]) if kvs else None

    def get_prefix(self, prefix: str) -> list[Entry]:
        reply = self._call("/kv/range", {"key": _b64(prefix), "range_end": _prefix_end(prefix)})
        return [_entry(kv) for kv in reply.get("kvs", [])]

    def put(self, key: str, value: Any, *, lease: int = 0) -> None:
        self._call("/kv/put", put(key, value, lease=lease)["request_put"])

    def transaction(self, compare: list[dict[str, Any]], success: list[dict[str, Any]],
                    failure: list[dict[str, Any]] | None = None) -> bool:
        """Every comparison holds: the ``success`` requests are applied, at once; True. Else
        ``failure``'s, and False."""
        reply = self._call("/kv/txn", {"compare": compare, "success": success, "failure": failure or []})
        return bool(reply.get("succeeded", False))

    def grant(self, ttl_ms: int) -> int:
        reply = self._call("/lease/grant", {"TTL": str(ttl_ms // 1000), "ID": "0"})
        return int(reply["ID"])

    def keep_alive(self, lease: int) -> bool:
        """Renew the lease; False if it has expired (etcd then answers a TTL of 0 or less)."""
        reply = self._call("/lease/keepalive", {"ID": str(lease)})
        return int(reply.get("result", {}).get("TTL", 0)) > 0

    def revoke(self, lease: int) -> None:
        self._call("/lease/revoke", {"ID": str(lease)})


def _message(said: str) -> str:
    """etcd's own message out of its JSON error reply."""
    try:
        return str(json.loads(said).get("message", said))
    except ValueError:
        return said


def _entry(kv: dict[str, Any]) -> Entry:
    raw = base64.b64decode(kv.get("value", ""))
    return Entry(base64.b64decode(kv["key"]).decode(), json.loads(raw) if raw else None,
                 int(kv.get("create_revision", 0)), int(kv.get("mod_revision", 0)), int(kv.get("lease", 0)))
