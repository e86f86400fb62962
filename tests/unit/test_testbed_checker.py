"""The test bed's checker (``harness/testbed/checker.py``) on histories written out by hand: each
anomaly found where it is and nowhere else."""

from __future__ import annotations

import pytest

from harness.testbed.checker import check, unavailable
from harness.testbed.history import Op, Outcome, Stored

pytestmark = pytest.mark.timeout(10)
T = "jepsen"


def sent(value: str, outcome: Outcome = "ok", *, at: tuple[int, int] = (0, 0), log: int = 0, host: str = "e0",
         resent: bool = False, when: float = 0.0, epoch: int = 0) -> Op:
    stored = Stored(T, at[0], at[1], log, host, epoch) if outcome == "ok" else None
    return Op(process="p", f="send", outcome=outcome, began_s=when, ended_s=when, value=value, stored=stored,
              resent=resent)


def test_every_acknowledged_value_where_it_was_acknowledged_is_no_anomaly() -> None:
    ops = [sent("a", at=(0, 0)), sent("b", at=(0, 1), log=100), sent("c", "info"), sent("d", "fail")]
    verdict = check(ops, {(T, 0): {0: "a", 1: "b", 2: "c"}}, mode="SYNC", epochs=[(1, 0)])
    assert verdict.ok(), verdict.summary()
    assert verdict.counts["send_ok"] == 2 and verdict.counts["send_info"] == 1


def test_lost_moved_duplicated_phantom_and_changed_are_each_found() -> None:
    ops = [sent("lost", at=(0, 0)), sent("moved", at=(0, 1)), sent("twice", at=(0, 2)),
           Op(process="r", f="read", outcome="ok", began_s=0, ended_s=0, read=[(T, 0, 2, "twice"), (T, 0, 5, "gone")])]
    final = {(T, 0): {1: "x", 2: "twice", 3: "twice", 4: "moved", 6: "never sent"}}
    verdict = check(ops, final, mode="SYNC", epochs=[(1, 0)])
    assert {kind for kind, found in verdict.anomalies.items() if found} == \
        {"lost", "moved", "duplicated", "phantom", "changed"}, verdict.summary()
    assert verdict.anomalies["changed"] == ["jepsen/0/5: gone then None"]


def test_a_value_sent_again_after_a_broken_connection_may_be_stored_twice() -> None:
    ops = [sent("again", at=(0, 0), resent=True), sent("unknown", "info")]
    verdict = check(ops, {(T, 0): {0: "again", 1: "again", 2: "unknown", 3: "unknown"}}, mode="SYNC", epochs=[])
    assert verdict.ok(), verdict.summary()
    assert verdict.counts["stored_twice_after_a_resend"] == 2


def test_asynchronous_replication_may_lose_what_it_acknowledged_but_says_so() -> None:
    verdict = check([sent("a", at=(0, 0))], {(T, 0): {}}, mode="ASYNC", epochs=[])
    assert verdict.ok() and verdict.anomalies["lost"] == ["a@jepsen/0/0"]
    assert not check([sent("a", at=(0, 0))], {(T, 0): {}}, mode="SYNC", epochs=[]).ok()


def test_two_engines_acknowledging_in_one_epoch_or_at_once_or_outside_their_epoch_are_found() -> None:
    final = {(T, 0): {0: "a", 1: "b", 2: "c"}}
    history = [(1, 0), (2, 400), (3, 800)]
    ops = [sent("a", at=(0, 0), log=0, host="e0", epoch=1, when=1.0),
           sent("b", at=(0, 1), log=500, host="e1", epoch=2, when=2.0),
           sent("c", at=(0, 2), log=900, host="e0", epoch=3, when=3.0)]
    assert check(ops, final, mode="SYNC", epochs=history).ok()  # e0, then e1, then e0 again
    ops[2] = sent("c", at=(0, 2), log=900, host="e0", epoch=2, when=3.0)
    verdict = check(ops, final, mode="SYNC", epochs=history)
    assert verdict.anomalies["two masters in an epoch"] == ["epoch 2: ['e0', 'e1']"]
    assert verdict.anomalies["outside its epoch"] == ["c of epoch 2 at 900"]  # epoch 3 began at 800
    ops[2] = sent("c", at=(0, 2), log=300, host="e0", epoch=1, when=3.0)  # the old master, after e1 acknowledged
    verdict = check(ops, final, mode="ASYNC", epochs=history)
    assert list(verdict.violations) == ["two masters at once"], verdict.summary()


def test_unavailability_is_the_longest_gap_between_acknowledgements_from_a_fault_to_after_its_heal() -> None:
    ops = [sent("a", when=1.0), sent("b", when=2.0),
           Op(process="nemesis", f="kill-engine", outcome="start", began_s=2.5, ended_s=2.5, value="e0"),
           sent("c", when=3.0),
           Op(process="nemesis", f="kill-engine", outcome="heal", began_s=4.0, ended_s=4.0, value="e0"),
           sent("d", when=7.5), sent("e", when=8.0)]
    assert unavailable(ops) == [("kill-engine e0", 4.5)]  # 3.0 to 7.5


def test_the_first_acknowledgement_after_a_fault_is_of_a_send_begun_after_it() -> None:
    ops = [Op(process="nemesis", f="kill-engine", outcome="start", began_s=2.0, ended_s=2.0, value="e0"),
           Op(process="p", f="send", outcome="ok", began_s=1.9, ended_s=2.5, value="begun before"),
           Op(process="p", f="send", outcome="ok", began_s=2.1, ended_s=4.75, value="begun after"),
           Op(process="nemesis", f="kill-engine", outcome="heal", began_s=5.0, ended_s=5.0, value="e0")]
    assert check(ops, {(T, 0): {}}, mode="ASYNC", epochs=[]).first_ack_s == [("kill-engine e0", 2.75)]


def test_an_older_master_acknowledging_after_a_newer_one_answered_as_master_is_two_at_once() -> None:
    seen = Op(process="observer", f="master", outcome="ok", began_s=2.0, ended_s=2.1, value="e1", epoch=2)
    before = sent("a", at=(0, 0), host="e0", epoch=1, when=1.5)
    after = sent("b", at=(0, 1), host="e0", epoch=1, when=2.5)
    final = {(T, 0): {0: "a", 1: "b"}}
    assert check([seen, before, sent("b", "info")], final, mode="ASYNC", epochs=[]).ok()
    assert list(check([seen, before, after], final, mode="ASYNC", epochs=[]).violations) == ["two masters at once"]


def test_values_of_an_earlier_run_are_no_phantoms_but_reads_of_them_are_held() -> None:
    read = Op(process="r", f="read", outcome="ok", began_s=0, ended_s=0, read=[(T, 0, 0, "s1-old")])
    assert check([read], {(T, 0): {0: "s1-old"}}, mode="SYNC", epochs=[], prefix="s2-").ok()
    assert not check([read], {(T, 0): {0: "s1-old"}}, mode="SYNC", epochs=[]).ok()  # a phantom of this run
    assert list(check([read], {(T, 0): {}}, mode="SYNC", epochs=[], prefix="s2-").violations) == ["changed"]


def test_a_queue_whose_store_time_goes_back_is_found_and_level_times_are_not() -> None:
    ops = [sent("a", at=(0, 0)), sent("b", at=(0, 1)), sent("c", at=(0, 2)), sent("d", at=(1, 0))]
    final = {(T, 0): {0: "a", 1: "b", 2: "c"}, (T, 1): {0: "d"}}
    level = check(ops, final, mode="SYNC", epochs=[(1, 0)], stamps={(T, 0): {0: 5, 1: 5, 2: 6}, (T, 1): {0: 1}})
    assert level.ok(), level.summary()
    back = check(ops, final, mode="SYNC", epochs=[(1, 0)], stamps={(T, 0): {2: 4, 0: 5, 1: 5}, (T, 1): {0: 1}})
    assert back.anomalies["store time went back"] == ["jepsen/0/2: 4 after 5 at 1"], back.summary()


def delivered(member: str, when: float, *positions: tuple[int, int]) -> Op:
    return Op(process=member, f="consume", outcome="ok", began_s=when, ended_s=when,
              read=[(T, q, offset, f"v{q}-{offset}") for q, offset in positions])


def holds(member: str, when: float, *queues: int) -> Op:
    return Op(process=member, f="holds", outcome="ok", began_s=when, ended_s=when, value=",".join(map(str, queues)))


def test_a_queue_handed_over_is_one_member_at_a_time_and_two_readers_at_once_are_found() -> None:
    handed_over = [delivered("a", 1.0, (0, 0)), holds("a", 1.0, 0), delivered("a", 2.0, (0, 1)), holds("a", 2.5),
                   delivered("b", 3.0, (0, 1), (1, 0)), holds("b", 3.0, 0, 1),  # from the last commit: again
                   delivered("a", 3.5, (2, 0)), holds("a", 3.5, 2)]
    verdict = check(handed_over, {}, mode="SYNC", epochs=[(1, 0)])
    assert verdict.ok(), verdict.summary()
    assert (verdict.counts["group_delivered"], verdict.counts["group_delivered_again"]) == (5, 1)
    # a keeps reading queue 0 (never seen to let it go) while b reads it too
    both = [delivered("a", 1.0, (0, 0)), holds("a", 1.0, 0), delivered("b", 1.5, (0, 1)), holds("b", 1.5, 0),
            delivered("a", 2.0, (0, 2)), holds("a", 2.0, 0)]
    verdict = check(both, {}, mode="SYNC", epochs=[(1, 0)])
    assert verdict.anomalies["two members at once"] == ["jepsen/0: a 1.000-2.000, b 1.500-1.500"], verdict.summary()
