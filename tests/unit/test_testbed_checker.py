"""The test bed's checker (``harness/testbed/checker.py``) on histories written out by hand: each
anomaly found where it is and nowhere else."""

from __future__ import annotations

import pytest

from harness.testbed.checker import check, unavailable
from harness.testbed.history import Op, Outcome, Stored

pytestmark = pytest.mark.timeout(10)
T = "jepsen"


def sent(value: str, outcome: Outcome = "ok", *, at: tuple[int, int] = (0, 0), log: int = 0, host: str = "e0",
         resent: bool = False, when: float = 0.0) -> Op:
    stored = Stored(T, at[0], at[1], log, host) if outcome == "ok" else None
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


def test_two_engines_acknowledging_in_one_epoch_are_found_by_the_log_offset() -> None:
    ops = [sent("a", at=(0, 0), log=0, host="e0"), sent("b", at=(0, 1), log=500, host="e1"),
           sent("c", at=(0, 2), log=900, host="e0")]
    final = {(T, 0): {0: "a", 1: "b", 2: "c"}}
    assert check(ops, final, mode="SYNC", epochs=[(1, 0), (2, 400), (3, 800)]).ok()  # e0, then e1, then e0
    verdict = check(ops, final, mode="SYNC", epochs=[(1, 0), (2, 400)])  # e1 and e0 both in epoch 2
    assert verdict.anomalies["two masters in an epoch"] == ["epoch 2: ['e0', 'e1']"]


def test_unavailability_is_the_longest_gap_between_acknowledgements_from_a_fault_to_after_its_heal() -> None:
    ops = [sent("a", when=1.0), sent("b", when=2.0),
           Op(process="nemesis", f="kill-engine", outcome="start", began_s=2.5, ended_s=2.5, value="e0"),
           sent("c", when=3.0),
           Op(process="nemesis", f="kill-engine", outcome="heal", began_s=4.0, ended_s=4.0, value="e0"),
           sent("d", when=7.5), sent("e", when=8.0)]
    assert unavailable(ops) == [("kill-engine e0", 4.5)]  # 3.0 to 7.5
