"""The RocketMQ 5 clients' call signature (``engine/security/signature.py``): the official Python
client's own signing checks here; a header that is not one, a bad date, a stranger, the wrong
secret and a date past the skew (either way) are each refused with their reason."""

from __future__ import annotations

import pytest
from rocketmq.v5.util.signature import Signature

from engine.security.signature import authorization, sign, verify

pytestmark = pytest.mark.timeout(10)

DATE = "20261202T162503Z"
DATE_MS = 1_796_228_703_000  # 2026-12-02 16:25:03 UTC
KEYS = {"ak": ("orders", "sk")}


def check(header: str, date: str = DATE, now_ms: int = DATE_MS) -> tuple[str | None, str]:
    signed = verify(header, date, KEYS.get, now_ms=now_ms, skew_ms_max=60_000)
    return signed.user, signed.reason


def test_the_official_client_s_signature_is_ours() -> None:
    assert sign("sk", DATE) == Signature.sign("sk", DATE)
    assert check(authorization("ak", "sk", DATE)) == ("orders", "")
    upper = f"MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=x-mq-date-time, Signature={sign('sk', DATE).upper()}"
    assert check(upper) == ("orders", "")  # the official Node client's hex is upper case


@pytest.mark.parametrize(("header", "date", "now_ms", "reason"), [
    ("", DATE, DATE_MS, "sent no credentials"),
    ("Basic dXNlcjpwYXNz", DATE, DATE_MS, "is not MQv2-HMAC-SHA1"),
    ("MQv2-HMAC-SHA1 Credential=ak, Signature=00", DATE, DATE_MS, "SignedHeaders=x-mq-date-time"),
    (authorization("ak", "sk", DATE), "2026-12-02 16:25:03", DATE_MS, "is not %Y%m%dT%H%M%SZ"),
    (authorization("who", "sk", DATE), DATE, DATE_MS, "no user has AccessKey 'who'"),
    (authorization("ak", "guess", DATE), DATE, DATE_MS, "is not its SecretKey's"),
    (authorization("ak", "sk", DATE), DATE, DATE_MS + 60_001, "more than 60000 ms"),
    (authorization("ak", "sk", DATE), DATE, DATE_MS - 60_001, "more than 60000 ms"),
])
def test_each_bad_signature_is_refused_with_its_reason(header: str, date: str, now_ms: int, reason: str) -> None:
    user, why = check(header, date, now_ms)
    assert user is None and reason in why, why
