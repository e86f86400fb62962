"""The checker of a test-bed run (``history.py``), Jepsen's way: what the clients were told is
held against what the set holds at the end, once every fault is healed.

* **lost**: an ok send whose value is not at the (topic, queue, offset) it was acknowledged at
  (under SYNC replication; ASYNC may lose what a dead master had not shipped: counted, allowed);
* **duplicated**: a value stored twice, unless its send went again after a broken connection
  (``resent``: at least once, as the docs say);
* **phantom**: a value stored that no client sent;
* **changed**: a value a read saw at (topic, queue, offset) that is not there at the end;
* **two masters in an epoch**: acknowledgements of one epoch (the epoch whose start in etcd's
  history is the last at or below the log offset) from more than one engine;
* **replica differs**: a replica's log not the master's, byte for byte, below the confirmed offset
  (found by the run, passed in).

``unavailable_s``: for each fault, the longest time without an acknowledgement from its start
to the first acknowledgement after its heal.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from harness.testbed.history import Op

Position = tuple[str, int, int]  # topic, queue, queue offset
EXAMPLES_MAX = 5


@dataclass
class Verdict:
    mode: Literal["SYNC", "ASYNC"]
    counts: Counter[str] = field(default_factory=Counter)  # ok, fail, info sends; reads
    anomalies: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    unavailable_s: list[tuple[str, float]] = field(default_factory=list)  # (fault, seconds without an ack)

    def anomaly(self, kind: str, example: str) -> None:
        self.anomalies[kind].append(example)

    @property
    def violations(self) -> dict[str, list[str]]:
        """The anomalies that break a promise (ASYNC's lost sends do not)."""
        return {kind: found for kind, found in self.anomalies.items()
                if found and not (kind == "lost" and self.mode == "ASYNC")}

    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        found = "; ".join(f"{kind}: {len(items)} ({', '.join(items[:EXAMPLES_MAX])})"
                          for kind, items in sorted(self.anomalies.items()) if items)
        return f"{self.mode} {counts} {found or 'no anomaly'}"


def check(ops: list[Op], final: dict[tuple[str, int], dict[int, str]], *, mode: Literal["SYNC", "ASYNC"],
          epochs: list[tuple[int, int]], replicas_differing: Sequence[str] = ()) -> Verdict:
    """``final``: (topic, queue) -> offset -> value, read from the master at the end; ``epochs``:
    (epoch, start offset) from etcd, oldest first."""
    verdict = Verdict(mode)
    sends = [op for op in ops if op.f == "send"]
    for op in sends:
        verdict.counts[f"send_{op.outcome}"] += 1
    where: dict[str, list[Position]] = defaultdict(list)
    for (topic, queue_id), queue in final.items():
        for offset, value in queue.items():
            where[value].append((topic, queue_id, offset))
    sent = {op.value for op in sends}
    resent = {op.value for op in sends if op.resent or op.outcome == "info"}
    for op in sends:
        if op.outcome != "ok" or op.stored is None:
            continue
        at = (op.stored.topic, op.stored.queue_id, op.stored.queue_offset)
        if at not in where[op.value]:
            kind = "lost" if not where[op.value] else "moved"
            verdict.anomaly(kind, f"{op.value}@{at[0]}/{at[1]}/{at[2]}")
    for value, positions in where.items():
        if value not in sent:
            verdict.anomaly("phantom", f"{value}@{positions[0]}")
        elif len(positions) > 1 and value in resent:
            verdict.counts["stored_twice_after_a_resend"] += 1  # at least once, as promised
        elif len(positions) > 1:
            verdict.anomaly("duplicated", f"{value}x{len(positions)}")
    for op in ops:
        if op.f != "read" or op.outcome != "ok":
            continue
        verdict.counts["reads"] += len(op.read)
        for topic, queue_id, offset, value in op.read:
            now = final.get((topic, queue_id), {}).get(offset)
            if now != value:
                verdict.anomaly("changed", f"{topic}/{queue_id}/{offset}: {value} then {now}")
    _one_master_an_epoch(sends, where, epochs, verdict)
    for differs in replicas_differing:
        verdict.anomaly("replica differs", differs)
    verdict.unavailable_s = unavailable(ops)
    return verdict


def _one_master_an_epoch(sends: list[Op], where: dict[str, list[Position]], epochs: list[tuple[int, int]],
                         verdict: Verdict) -> None:
    """Each acknowledgement still where it was made belongs to the epoch its log offset lies in:
    one engine only may have made those of an epoch."""
    starts = [start for _epoch, start in epochs]
    hosts: dict[int, set[str]] = defaultdict(set)
    for op in sends:
        if op.outcome != "ok" or op.stored is None or not epochs:
            continue
        if (op.stored.topic, op.stored.queue_id, op.stored.queue_offset) not in where[op.value]:
            continue  # lost: said so already; its offset may be another epoch's now
        k = bisect.bisect_right(starts, op.stored.log_offset) - 1
        hosts[epochs[max(k, 0)][0]].add(op.stored.host)
    for epoch, acked_by in sorted(hosts.items()):
        if len(acked_by) > 1:
            verdict.anomaly("two masters in an epoch", f"epoch {epoch}: {sorted(acked_by)}")


def unavailable(ops: list[Op]) -> list[tuple[str, float]]:
    """For each fault (start .. heal), the longest time without an acknowledged send from its
    start to the first acknowledgement after its heal (to the end of the history if none)."""
    acks = sorted(op.ended_s for op in ops if op.f == "send" and op.outcome == "ok")
    faults: list[tuple[str, float, float]] = []
    started: dict[str, tuple[str, float]] = {}
    for op in ops:
        if op.process != "nemesis":
            continue
        if op.outcome == "start":
            started[op.f + op.value] = (f"{op.f} {op.value}".strip(), op.began_s)
        elif op.outcome == "heal" and op.f + op.value in started:
            name, began = started.pop(op.f + op.value)
            faults.append((name, began, op.began_s))
    found = []
    for name, began, healed in faults:
        k = bisect.bisect_left(acks, began)
        after_heal = bisect.bisect_left(acks, healed)
        stop = acks[after_heal] if after_heal < len(acks) else (acks[-1] if acks else healed)
        times = [began, *acks[k:after_heal + 1], stop]
        found.append((name, max((b - a for a, b in itertools.pairwise(times)), default=0.0)))
    return found
