"""The front's services: the topic table's rules, consumer groups, key lookups, its figures.

Called by ``engine/actors/front.py``, for each request it routes or answers itself:

``topic_rules.py``, ``TopicRules``
    Which topics and queues a request may name; what creates, grows, lists and forgets topics.
``topic_deletions.py``, ``TopicDeletions``
    The deletions forwarded to the writer and not answered yet (a topic "being deleted").
``consumer_groups.py``, ``ConsumerGroups``
    The offsets groups commit, and the rule that a (group, topic) either commits or pops.
``group_members.py``, ``GroupMembers``
    Who shares a topic's queues, by their heartbeats, and who holds each queue now.
``key_lookup.py``, ``KeyLookup``
    ``query_by_key`` answered from the IndexFiles and the log, read-only (``engine/local_reads.py``
    runs it too, on the engine's host).
``figures.py``, ``FrontFigures``
    What the front counts of the requests it serves, and the ``status`` reply.
``shipped_config.py``, ``ShippedConfig``
    On a replica, when the config files its master sends changed, so the front reads them again.
"""
