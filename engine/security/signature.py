"""The RocketMQ 5 clients' request signature, checked as RocketMQ's proxy checks it.

Every call of an official client carries two headers (gRPC metadata)::

    x-mq-date-time: 20261202T162503Z
    authorization:  MQv2-HMAC-SHA1 Credential=<AccessKey>, SignedHeaders=x-mq-date-time,
                    Signature=<hex of HMAC-SHA1(SecretKey, the x-mq-date-time value)>

The signature proves the client holds the AccessKey's SecretKey; the date bounds how long a
signature copied off the wire can be played again: a date further than ``skew_ms_max`` from this
host's clock (either way) is refused. The clients write the date in UTC (the Python client writes
its local time with a ``Z``: run it in UTC, or it is refused as skewed by its time zone's offset).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

SCHEME = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"


@dataclass(frozen=True)
class Signed:
    """Who signed, or why it does not hold (``user`` None)."""
    user: str | None
    reason: str = ""


def sign(secret_key: str, date_time: str) -> str:
    """The ``Signature`` of ``date_time`` (the clients' ``Signature.sign``)."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def authorization(access_key: str, secret_key: str, date_time: str) -> str:
    """The ``authorization`` header a client sends with ``date_time``."""
    return (f"{SCHEME} Credential={access_key}, SignedHeaders={DATE_HEADER}, "
            f"Signature={sign(secret_key, date_time)}")


def verify(header: str, date_time: str, secret_of: Callable[[str], tuple[str, str] | None], *, now_ms: int,
           skew_ms_max: int) -> Signed:
    """The user whose SecretKey signed ``date_time`` in ``header``; ``secret_of``: AccessKey -> (user,
    SecretKey), or None for a key nobody has."""
    try:
        access_key, signature = _credential(header)
        signed_ms = int(datetime.strptime(date_time, DATE_FORMAT).replace(tzinfo=UTC).timestamp() * 1000)
    except ValueError as exc:
        return Signed(None, str(exc) if str(exc).startswith("the authorization") else
                      f"x-mq-date-time {date_time!r} is not {DATE_FORMAT}")
    if abs(now_ms - signed_ms) > skew_ms_max:
        return Signed(None, f"the signature's date {date_time} is more than {skew_ms_max} ms from this host's "
                            f"clock (a replay, or a clock or time zone off)")
    known = secret_of(access_key)
    if known is None:
        return Signed(None, f"no user has AccessKey {access_key!r}")
    user, secret_key = known
    if not hmac.compare_digest(sign(secret_key, date_time), signature.lower()):  # the Node client's is upper case
        return Signed(None, f"the signature of AccessKey {access_key!r} is not its SecretKey's")
    return Signed(user)


def _credential(header: str) -> tuple[str, str]:
    """(AccessKey, Signature) of an ``authorization`` header; ValueError if it is not one."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme != SCHEME:
        raise ValueError(f"the authorization is not {SCHEME} (got {scheme or 'none'!r}): the client sent no "
                         f"credentials")
    fields = {}
    for part in rest.split(","):
        name, sep, value = part.strip().partition("=")
        if sep:
            fields[name] = value
    access_key, signature = fields.get("Credential", ""), fields.get("Signature", "")
    if not access_key or not signature or fields.get("SignedHeaders") != DATE_HEADER:
        raise ValueError("the authorization names no Credential, Signature or SignedHeaders=x-mq-date-time")
    return access_key, signature
