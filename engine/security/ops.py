"""What each op of the client protocol (docs/protocol.md) needs of the ACL, as checks.

    op                                                  needs
    send, end_transaction                               pub on its topic
    pull, query_by_key(s), queue_stats, offset_for_time sub on its topic
    pop, ack, change_invisible, commit_offset,          sub on its topic and sub on its group
      fetch_offset, heartbeat
    get_by_id, get_by_offset                            sub on the cluster (a message of any topic)
    create_topic / delete_topic                         create / delete on its topic
    status, pop_stats, transaction_checks               admin on the cluster
    ping, route, list_topics                            nothing: any user

An op not in the table (a new one, an unknown one) needs admin on the cluster: nothing is
served unchecked by omission. A topic created or deleted is written to the audit log when it
is allowed, as a refusal is when it is not.
"""

from __future__ import annotations

import functools

from engine.security.acl import Check

# op -> what it needs: (resource type, action) pairs, each on the request's topic, group or the cluster
_NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    **dict.fromkeys(("ping", "route", "list_topics"), ()),
    **dict.fromkeys(("send", "end_transaction"), (("topic", "pub"),)),
    **dict.fromkeys(("pull", "query_by_key", "query_by_keys", "queue_stats", "offset_for_time"), (("topic", "sub"),)),
    **dict.fromkeys(("pop", "ack", "change_invisible", "commit_offset", "fetch_offset", "heartbeat"),
                    (("topic", "sub"), ("group", "sub"))),
    **dict.fromkeys(("get_by_id", "get_by_offset"), (("cluster", "sub"),)),
    "create_topic": (("topic", "create"),),
    "delete_topic": (("topic", "delete"),),
}
_ADMIN = (("cluster", "admin"),)
AUDITED_OPS = frozenset({"create_topic", "delete_topic"})  # allowed, they are written to the audit log too


@functools.lru_cache(maxsize=4096)  # a front sees the same few (op, topic, group) again and again
def checks_of(op: str, topic: str | None, group: str | None, cluster: str) -> tuple[Check, ...]:
    """The checks a request of ``op`` on ``topic`` and ``group`` needs, on cluster ``cluster``."""
    names = {"topic": topic or "", "group": group or "", "cluster": cluster}
    return tuple(Check(kind, names[kind], action) for kind, action in _NEEDS.get(op, _ADMIN))
