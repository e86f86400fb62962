"""CURVE on the client endpoint: key pairs, the server side with its allow-list, the client side.

Keys are ZeroMQ certificates as pyzmq's ``zmq.auth`` writes them:
``NAME.key`` holds the public key, ``NAME.key_secret`` the public and the
secret key, both as 40-character Z85 strings. Clients in other languages
take the Z85 strings (``python -m engine keygen`` prints them).

The server authenticates through ZAP (RFC 27): a ``ThreadAuthenticator`` in
the front accepts a client only if its public key is one of the ``*.key``
files in ``curve_authorized_keys_dir``. A client with another key, or a
plaintext client, never gets a reply: ZeroMQ rejects the handshake
silently, so clients must use timeouts. Without the authenticator libzmq
would accept any key (encryption without authentication), so the front
refuses to start CURVE without it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CurveKeys:
    """What a client needs: the server's public key and its own key pair (Z85 strings)."""

    server_public_key: str
    public_key: str
    secret_key: str

    @classmethod
    def from_files(cls, server_public_file: str | Path, client_secret_file: str | Path) -> CurveKeys:
        server_public, _ = zmq.auth.load_certificate(server_public_file)
        public, secret = zmq.auth.load_certificate(client_secret_file)
        if secret is None:
            raise ValueError(f"{client_secret_file} holds no secret key (use the .key_secret file)")
        return cls(server_public.decode(), public.decode(), secret.decode())

    def apply(self, sock: zmq.Socket[object]) -> None:
        sock.curve_serverkey = self.server_public_key.encode()
        sock.curve_publickey = self.public_key.encode()
        sock.curve_secretkey = self.secret_key.encode()


def public_key_of(certificate: str | Path) -> str:
    """The public key (Z85) of a certificate file, public or secret."""
    public, _secret = zmq.auth.load_certificate(certificate)
    return public.decode()


def keygen(directory: Path, name: str) -> tuple[Path, Path]:
    """Write ``NAME.key`` and ``NAME.key_secret`` (mode 0600) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for suffix in (".key", ".key_secret"):
        if (directory / f"{name}{suffix}").exists():
            raise FileExistsError(f"{directory / (name + suffix)} exists; keys are never overwritten")
    public_file, secret_file = zmq.auth.create_certificates(str(directory), name)
    os.chmod(secret_file, 0o600)
    return Path(public_file), Path(secret_file)


def load_server_keys(secret_file: str | Path) -> tuple[bytes, bytes]:
    """(public, secret) of the server's certificate; ValueError with the reason if unusable."""
    try:
        public, secret = zmq.auth.load_certificate(secret_file)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the server key {secret_file}: {exc}") from None
    if secret is None:
        raise ValueError(f"{secret_file} holds no secret key (give the .key_secret file)")
    return public, secret


def check_authorized_keys_dir(directory: str | Path) -> int:
    """How many client public keys the allow-list holds; ValueError if the directory is unusable."""
    path = Path(directory)
    if not path.is_dir():
        raise ValueError(f"curve_authorized_keys_dir {path} is not a directory")
    return len([name for name in os.listdir(path) if name.endswith(".key")])


def secret_keys_in(directory: str | Path) -> list[str]:
    """The ``*.key_secret`` files in the allow-list's directory: never read (the allow-list is
    ``*.key``), but a client's secret key has no business where the server reads, so they are
    named in a warning."""
    try:
        return sorted(name for name in os.listdir(directory) if name.endswith(".key_secret"))
    except OSError:
        return []


class _Allowed:
    """ZAP's credentials provider that lets in the keys ``keys()`` returns; each other key it refuses
    is logged once (a peer retries its handshake every reconnect interval)."""

    def __init__(self, keys: Callable[[], frozenset[bytes]], whose: str) -> None:
        self.keys = keys
        self.whose = whose
        self.refused: set[bytes] = set()

    def callback(self, _domain: str, key: bytes) -> bool:
        """``key``: Z85, as pyzmq's authenticator hands it over (and as ``load_certificate`` reads it)."""
        if key in self.keys():
            return True
        if key not in self.refused and len(self.refused) < 1_000:
            self.refused.add(key)
            log.warning("refused a peer whose CURVE key %s is not %s", key.decode(), self.whose)
        return False


def member_key_file(directory: str | Path, broker_id: int) -> Path:
    """Where a broker set's member ``broker_id`` has its replication public key."""
    return Path(directory) / f"member-{broker_id}.key"


class _MemberKeys:
    """The public keys in a set's members' directory (``member-<broker_id>.key``), read again
    when the directory changes (a member added or removed)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.mtime_ns = -1
        self.keys: frozenset[bytes] = frozenset()

    def __call__(self) -> frozenset[bytes]:
        try:
            mtime_ns = os.stat(self.directory).st_mtime_ns
        except OSError:
            return self.keys  # unreadable: the last list (none, at first)
        if mtime_ns != self.mtime_ns:
            self.mtime_ns = mtime_ns
            self.keys = frozenset(public_key_of(Path(self.directory) / name).encode()
                                  for name in os.listdir(self.directory)
                                  if name.startswith("member-") and name.endswith(".key"))
        return self.keys


class ReplicationKeys:
    """The replication channel's CURVE (``replication_curve_secret_key_file``), one of two ways:

    - the set's key: every engine of a broker set holds the same key pair; the master's sender is
      a CURVE server with it and lets in only a peer proving it, and a replica's receiver proves it
      and takes the master for a member of its set only if the master proves it too;
    - each engine its own key pair, with ``replication_curve_authorized_keys_dir`` holding its set's
      members' public keys (``member-<broker_id>.key``): the sender lets in the members' keys, and a
      receiver follows a master only if it proves the key of the member it is told is master
      (``replica_of_broker_id``, from the election's role).

    Either way nothing without a member's secret gets a byte of the log, or can pose as a master
    or a replica."""

    def __init__(self, context: zmq.Context[zmq.Socket[object]], secret_file: str, members_dir: str = "",
                 master_id: int = 0) -> None:
        self.public, self.secret = load_server_keys(secret_file)
        self.context = context
        self.members_dir = members_dir
        self.master_id = master_id
        self.authenticator: ThreadAuthenticator | None = None

    def serve(self, sock: zmq.Socket[object]) -> None:
        """Before ``bind``: a CURVE server that lets in the set's key, or its members' keys, only."""
        if self.authenticator is None:
            self.authenticator = ThreadAuthenticator(self.context)
            self.authenticator.start()
            allowed = _Allowed(_MemberKeys(self.members_dir), f"a member's in {self.members_dir}") \
                if self.members_dir else _Allowed(lambda: frozenset((self.public,)), "the broker set's replication key")
            self.authenticator.configure_curve_callback(domain="*", credentials_provider=allowed)
        sock.curve_server = True
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret

    def join(self, sock: zmq.Socket[object]) -> None:
        """Before ``connect``: a CURVE client proving this engine's key to a master that must prove
        the set's key, or its own member's key. ValueError: that member has no key here."""
        if self.members_dir:
            master_file = member_key_file(self.members_dir, self.master_id)
            try:
                sock.curve_serverkey = public_key_of(master_file).encode()
            except (OSError, ValueError) as exc:
                raise ValueError(f"the master (broker_id {self.master_id}) has no replication key "
                                 f"{master_file} here: {exc}") from None
        else:
            sock.curve_serverkey = self.public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret

    def stop(self) -> None:
        if self.authenticator is not None:
            self.authenticator.stop()


class CurveServer:
    """Makes a ROUTER a CURVE server and runs the ZAP allow-list beside it."""

    def __init__(self, context: zmq.Context[zmq.Socket[object]], secret_file: str, authorized_keys_dir: str) -> None:
        self.public, self.secret = load_server_keys(secret_file)
        self.authorized_keys_dir = authorized_keys_dir
        self.authenticator = ThreadAuthenticator(context)
        self.authenticator.start()
        self._allow_list_mtime_ns = -1
        self.reload_allow_list()

    def secure(self, sock: zmq.Socket[object]) -> None:
        """Call before ``bind``."""
        sock.curve_server = True
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret

    def reload_allow_list(self) -> bool:
        """Read the allow-list again if the directory changed (a key added or removed); True if read."""
        try:
            mtime_ns = os.stat(self.authorized_keys_dir).st_mtime_ns
        except FileNotFoundError:
            mtime_ns = -2
        if mtime_ns == self._allow_list_mtime_ns:
            return False
        self._allow_list_mtime_ns = mtime_ns
        # configure_curve reads every *.key file (an unreadable directory keeps the last list,
        # and allows nobody if there was none).
        self.authenticator.configure_curve(domain="*", location=self.authorized_keys_dir)
        if secrets := secret_keys_in(self.authorized_keys_dir):
            log.warning("%s holds secret keys (%s), which it should not: only clients' public *.key files "
                        "are read there; keep each .key_secret with its client", self.authorized_keys_dir,
                        ", ".join(secrets))
        return True

    def stop(self) -> None:
        self.authenticator.stop()
