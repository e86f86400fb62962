"""The front's record of consumer group members (engine/services/front/group_members.py) and the
allocation every member computes from it (rmqpy/_allocation.py)."""

from __future__ import annotations

import pytest

from engine.errors import ErrorCode, RequestError
from engine.services.front.group_members import GroupMembers
from rmqpy._allocation import allocate_averagely


def test_members_expire_after_their_session_and_the_list_settles_after_one_session() -> None:
    members = GroupMembers(session_timeout_ms=1_000, members_max=10)
    assert members.beat("g", "t", "b", 0).members == ["b"]
    joined = members.beat("g", "t", "a", 400)
    assert joined.members == ["a", "b"] and joined.settled, "a group this front never had is settled at once"
    assert members.beat("g", "t", "a", 1_200).members == ["a"], "b sent nothing for a session: gone"
    assert members.beat("g", "t", "a", 1_300, leaving=True).members == []
    members.expire(2_500)
    assert members.member_counts() == {}


def test_a_new_member_past_the_limit_is_refused_until_a_session_ends() -> None:
    members = GroupMembers(session_timeout_ms=1_000, members_max=2)
    members.beat("g", "t", "a", 0)
    members.beat("h", "t", "b", 500)
    members.beat("g", "t", "a", 600)  # a known member may always beat
    with pytest.raises(RequestError) as refused:
        members.beat("g", "t", "c", 700)
    assert refused.value.code == ErrorCode.LIMIT_EXCEEDED
    assert members.beat("g", "t", "c", 1_600).members == ["c"], "b's session ended at 1 500 (a's at 1 600)"


def test_forgetting_a_topic_drops_its_groups() -> None:
    members = GroupMembers(session_timeout_ms=1_000, members_max=2)
    members.beat("g", "t", "a", 0)
    members.beat("g", "u", "a", 0)
    members.forget_topic("t")
    assert members.member_counts() == {("g", "u"): 1}
    members.beat("g", "t", "b", 10)  # room again for one


@pytest.mark.parametrize(("queues", "members", "expected"), [
    (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
    (8, 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (2, 3, [[0], [1], []]),
    (5, 5, [[0], [1], [2], [3], [4]]),
    (10, 4, [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]),
])
def test_average_allocation_gives_contiguous_runs_as_rocketmq(queues: int, members: int,
                                                              expected: list[list[int]]) -> None:
    names = [f"m{i}" for i in range(members)]
    shares = [allocate_averagely(range(queues), names, name) for name in names]
    assert shares == expected
    assert sorted(q for share in shares for q in share) == list(range(queues))
    assert allocate_averagely(range(queues), names, "not-a-member") == []


def test_a_queue_is_granted_only_once_its_holder_lets_it_go_or_dies() -> None:
    members = GroupMembers(session_timeout_ms=1_000, members_max=10)
    assert members.beat("g", "t", "a", 1_000, queues=[0, 1, 2, 3]).granted == [0, 1, 2, 3]
    assert members.beat("g", "t", "b", 1_100, queues=[2, 3]).granted == [], "a still holds 2 and 3"
    assert members.beat("g", "t", "a", 1_200, queues=[0, 1]).granted == [0, 1]  # a lets 2 and 3 go
    assert members.beat("g", "t", "b", 1_300, queues=[2, 3]).granted == [2, 3]
    assert members.beat("g", "t", "b", 2_100, queues=[0, 1, 2, 3]).granted == [2, 3], "a lives until 2 200"
    assert members.beat("g", "t", "b", 2_300, queues=[0, 1, 2, 3]).granted == [0, 1, 2, 3], "a's session ended"
    assert members.beat("g", "t", "c", 2_400, queues=[0]).granted == []
    members.beat("g", "t", "b", 2_500, leaving=True)
    assert members.beat("g", "t", "c", 2_600, queues=[0]).granted == [0], "a leaving member lets go of all"


def test_a_front_that_just_started_grants_only_what_members_read_for_one_session() -> None:
    """After a restart the front does not know who reads what: in a group that had members, one
    claiming a queue it does not read waits until every live member has beaten, so it never takes
    one another still reads. A group the front never had starts at once."""
    members = GroupMembers(session_timeout_ms=1_000, members_max=10, started_ms=0, inherited=[("g", "t")])
    new = members.beat("g", "t", "new", 0, queues=[0, 1, 2, 3])
    assert (new.granted, new.settled) == ([], False), "nothing is known to be free yet"
    assert members.beat("g", "t", "old", 300, queues=[2, 3], held=[2, 3]).granted == [2, 3], "re-claimed"
    assert members.beat("g", "t", "new", 900, queues=[0, 1, 2, 3]).granted == []
    settled = members.beat("g", "t", "new", 1_000, queues=[0, 1, 2, 3])
    assert (settled.granted, settled.settled) == ([0, 1], True), "free ones once settled; old still reads 2, 3"
    fresh = members.beat("h", "t", "x", 10, queues=[0])
    assert (fresh.granted, fresh.settled) == ([0], True), "a group the front never had"


def test_a_heartbeat_older_than_the_last_taken_changes_nothing() -> None:
    members = GroupMembers(session_timeout_ms=1_000, members_max=10)
    assert members.beat("g", "t", "a", 0, queues=[0, 1, 2], seq=2).granted == [0, 1, 2]
    late = members.beat("g", "t", "a", 10, queues=[0], seq=1)  # sent before 2, over an earlier connection
    assert late.granted == [0, 1, 2], "it lets nothing go"
    assert members.beat("g", "t", "a", 20, queues=[0], seq=3).granted == [0]
