"""The ACL as a process applies it (the front, the gRPC endpoint): read again when its file
changes, each refusal written to the audit log and counted by code.

With ``acl_enabled`` and no usable ACL file every request is refused (``UNAUTHENTICATED``), and the
process log says why: an engine that was told to check permissions never serves without them.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections import Counter
from pathlib import Path

from engine.security import acl as acl_file
from engine.security.acl import REFUSAL_CODES, Acl, AclError, Check, Refusal
from engine.security.audit import AuditLog

log = logging.getLogger(__name__)

RELOAD_LOOK_MS = 1_000  # how often the ACL file's stamp is looked at
DECISIONS_MAX = 4_096  # decisions remembered for the ACL read last (cleared when it is read again)


@functools.lru_cache(maxsize=4096)
def ip_text(ip: bytes) -> str:
    """A client's IP as the front has it (4 or 16 bytes; b"" for none) in its usual text form."""
    if len(ip) == 4:
        return socket.inet_ntop(socket.AF_INET, ip)
    if len(ip) == 16:
        return socket.inet_ntop(socket.AF_INET6, ip)
    return ""


class Guard:
    def __init__(self, store_dir: Path, audit: AuditLog) -> None:
        self.store_dir = store_dir
        self.audit = audit
        self.refusals: Counter[str] = Counter()  # by code
        self._acl: Acl | None = None
        self._stamp: tuple[int, int] | None = None
        self._looked_ms = -RELOAD_LOOK_MS
        self._broken = ""
        # (user, checks, source) -> the decision, for the ACL read last: a client sends the same
        # request shape again and again, and the policies are walked once for it
        self._decisions: dict[tuple[str | None, tuple[Check, ...], str], Refusal | None] = {}

    def acl(self) -> Acl | None:
        """The ACL now (its file looked at again at most every ``RELOAD_LOOK_MS``)."""
        now_ms = time.monotonic_ns() // 1_000_000
        if now_ms - self._looked_ms < RELOAD_LOOK_MS:
            return self._acl
        self._looked_ms = now_ms
        path = self.store_dir / acl_file.ACL_FILE
        try:
            st = os.stat(path)
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp and (self._acl is not None or self._broken):
            return self._acl
        self._stamp = stamp
        self._decisions.clear()
        try:
            self._acl = acl_file.load(self.store_dir)
            self._broken = "" if self._acl is not None else f"no ACL file at {path}"
        except (AclError, OSError) as exc:
            self._acl, self._broken = None, f"the ACL file {path} cannot be used: {exc}"
        if self._broken:
            log.error("%s: every request is refused until it is fixed (python -m engine acl)", self._broken)
        else:
            log.info("ACL read: %d users, %d policies", len(self._acl.file.users) if self._acl else 0,
                     len(self._acl.file.policies) if self._acl else 0)
        return self._acl

    def check(self, user: str | None, checks: tuple[Check, ...], *, source: str, op: str,
              unknown: str = "") -> Refusal | None:
        """None if allowed; else the refusal, audited and counted. ``unknown``: what the client
        showed when it is no user (its key), for the audit log."""
        acl = self.acl()
        key = (user, checks, source)
        if key in self._decisions:
            refusal = self._decisions[key]
        else:
            refusal = (acl.authorize(user, checks, source) if acl is not None
                       else Refusal("UNAUTHENTICATED", f"this engine checks permissions and {self._broken}"))
            if len(self._decisions) >= DECISIONS_MAX:
                self._decisions.clear()
            self._decisions[key] = refusal
        if refusal is not None:
            self.refuse(refusal, user=user or (f"key:{unknown}" if unknown else ""), source=source, op=op)
        return refusal

    def refuse(self, refusal: Refusal, *, user: str | None, source: str, op: str) -> None:
        """Audit and count a refusal made here or before (a bad signature)."""
        self.refusals[refusal.code] += 1
        self.audit.record("refused", code=refusal.code, subject=user or "", source=source, op=op,
                          resource=refusal.resource, action=refusal.action, message=refusal.message)

    def detail(self) -> dict[str, int]:
        """The refusals by code, as the actor's heartbeat carries them (``rmqpy_auth_refusals``)."""
        return {f"refused_{code.lower()}": self.refusals[code] for code in REFUSAL_CODES}
