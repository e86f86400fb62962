"""Tag subscriptions: ``"*"`` (every message) or tags joined by ``||`` (``"paid || refunded"``).

The engine filters (docs/protocol.md 4.2): it compares each message's tag with the
subscription's, so a consumer receives only what it subscribed to and its offsets still
move past the rest. Consumers take the expression as a string or as a list of tags;
``subscription_expression`` turns either into the string the protocol carries.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["EVERYTHING", "subscription_expression"]

EVERYTHING = "*"


def subscription_expression(subscription: str | Iterable[str]) -> str:
    """The protocol's expression for ``subscription``: ``"*"``, a tag, ``"a || b"``, or a list of tags."""
    if isinstance(subscription, str):
        tags = [tag.strip() for tag in subscription.split("||")]
    else:
        tags = [tag.strip() for tag in subscription]
    if tags == [EVERYTHING]:
        return EVERYTHING
    if not tags or any(not tag or tag == EVERYTHING or "||" in tag for tag in tags):
        raise ValueError(f"a subscription is '*' or tags joined by '||', not {subscription!r}")
    return " || ".join(tags)
