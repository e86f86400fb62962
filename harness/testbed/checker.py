"""The checker of a test-bed run (``history.py``), Jepsen's way: what the clients were told is
held against what the set holds at the end, once every fault is healed.

* **lost**: an ok send whose value is not at the (topic, queue, offset) it was acknowledged at
  (under SYNC replication; ASYNC may lose what a dead master had not shipped: counted, allowed,
  as are reads of it that changed);
* **duplicated**: a value stored twice, unless its send went again after a broken connection
  (``resent``: at least once, as the docs say);
* **phantom**: a value stored that no client sent;
* **changed**: a value a read saw at (topic, queue, offset) that is not there at the end;
* **two masters in an epoch**: acknowledgements of one epoch (the reply's) from more than one
  engine;
* **two masters at once**: an acknowledgement of an older epoch for a send begun after one of a
  newer epoch was acknowledged, or after an engine answered its route as the newer epoch's master;
* **outside its epoch**: an acknowledged send whose log offset is not in its epoch's stretch of
  the log (from its start in etcd's history to the next's);
* **replica differs**: a replica's log not the master's, byte for byte, below the confirmed offset
  (found by the run, passed in);
* **two members at once**: a queue delivered by two members of a consumer group in stretches of
  time that overlap. A member's stretch of a queue runs from a poll that delivered from it to the
  last such poll before the member was seen reading it no more (its ``holds``, noted after each
  poll and when its consumer closed); it read the queue all along, so another's delivery inside
  it is two readers at once, which the group's hand-over promises never happens;
* **store time went back**: a queue's store timestamps, in queue order, not rising or level (the
  writer stamps ``max(now, the last stamp)``, whatever a host's wall clock does and whichever
  engine is master).

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
    first_ack_s: list[tuple[str, float]] = field(default_factory=list)  # (fault, to a send begun after it acked)

    def anomaly(self, kind: str, example: str) -> None:
        self.anomalies[kind].append(example)

    @property
    def violations(self) -> dict[str, list[str]]:
        """The anomalies that break a promise (ASYNC may lose what it acknowledged, and what was
        read of it)."""
        return {kind: found for kind, found in self.anomalies.items()
                if found and not (kind in ("lost", "changed") and self.mode == "ASYNC")}

    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        found = "; ".join(f"{kind}: {len(items)} ({', '.join(items[:EXAMPLES_MAX])})"
                          for kind, items in sorted(self.anomalies.items()) if items)
        return f"{self.mode} {counts} {found or 'no anomaly'}"


def check(ops: list[Op], final: dict[tuple[str, int], dict[int, str]], *, mode: Literal["SYNC", "ASYNC"],
          epochs: list[tuple[int, int]], replicas_differing: Sequence[str] = (), prefix: str = "",
          stamps: dict[tuple[str, int], dict[int, int]] | None = None) -> Verdict:
    """``final``: (topic, queue) -> offset -> value, read from the master at the end; ``stamps``: the
    same messages' store timestamps (ms), when read; ``epochs``:
    (epoch, start offset) from etcd, oldest first; ``prefix``: the values this history's clients
    send begin with (others, an earlier run's, are no phantoms; a read of one is held like any)."""
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
        if not value.startswith(prefix):
            continue
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
    _one_master_an_epoch(sends, [op for op in ops if op.process == "observer"], where, epochs, verdict)
    for differs in replicas_differing:
        verdict.anomaly("replica differs", differs)
    for (topic, queue_id), times in (stamps or {}).items():
        ordered = sorted(times.items())
        for (offset, stamp), (next_offset, next_stamp) in itertools.pairwise(ordered):
            if next_stamp < stamp:
                verdict.anomaly("store time went back", f"{topic}/{queue_id}/{next_offset}: {next_stamp} after "
                                                        f"{stamp} at {offset}")
    _one_member_a_queue(ops, verdict)
    verdict.unavailable_s = unavailable(ops)
    verdict.first_ack_s = first_acknowledgement(ops)
    return verdict


def _one_master_an_epoch(sends: list[Op], observations: list[Op], where: dict[str, list[Position]],
                         epochs: list[tuple[int, int]], verdict: Verdict) -> None:
    """Each acknowledgement names the epoch of the master that made it (the reply's): one engine
    only acknowledges in an epoch; one still where it was made lies in its epoch's stretch of the
    log in etcd's history; and none of an older epoch is made for a send begun after one of a newer
    epoch was acknowledged, or its master answered as such (two masters at once)."""
    starts = dict(epochs)
    later = sorted(starts)
    hosts: dict[int, set[str]] = defaultdict(set)
    first_end: dict[int, float] = {}
    acked = [op for op in sends if op.outcome == "ok" and op.stored is not None and op.stored.epoch]
    observed = [op for op in observations if op.epoch]
    for op in acked:
        assert op.stored is not None
        epoch = op.stored.epoch
        hosts[epoch].add(op.stored.host)
        first_end[epoch] = min(first_end.get(epoch, op.ended_s), op.ended_s)
        if (op.stored.topic, op.stored.queue_id, op.stored.queue_offset) not in where[op.value] or epoch not in starts:
            continue  # lost (said so already), or an epoch etcd no longer holds
        k = bisect.bisect_right(later, epoch)
        stop = starts[later[k]] if k < len(later) else None
        if op.stored.log_offset < starts[epoch] or (stop is not None and op.stored.log_offset >= stop):
            verdict.anomaly("outside its epoch", f"{op.value} of epoch {epoch} at {op.stored.log_offset}")
    for epoch, acked_by in sorted(hosts.items()):
        if len(acked_by) > 1:
            verdict.anomaly("two masters in an epoch", f"epoch {epoch}: {sorted(acked_by)}")
    for op in observed:  # an engine that answered as master of an epoch: that epoch had begun then
        first_end[op.epoch] = min(first_end.get(op.epoch, op.ended_s), op.ended_s)
    newer_seen = sorted(first_end.items())
    for op in acked:
        assert op.stored is not None
        newer = [(e, end) for e, end in newer_seen if e > op.stored.epoch and end < op.began_s]
        if newer:
            verdict.anomaly("two masters at once", f"{op.value} acknowledged in epoch {op.stored.epoch}, sent after "
                                                   f"epoch {newer[0][0]} had a master")


def _one_member_a_queue(ops: list[Op], verdict: Verdict) -> None:
    stretches: dict[tuple[str, int], list[tuple[float, float, str]]] = defaultdict(list)  # (from, to, member)
    open_: dict[tuple[str, tuple[str, int]], list[float]] = {}  # (member, queue) -> [from, to]
    delivered: Counter[str] = Counter()
    for op in ops:  # each member's ops are in its own order: it notes them from one thread
        if op.f == "consume":
            for topic, queue_id, _offset, value in op.read:
                delivered[value] += 1
                span = open_.setdefault((op.process, (topic, queue_id)), [op.ended_s, op.ended_s])
                span[1] = op.ended_s
        elif op.f == "holds":
            held = {int(q) for q in op.value.split(",") if q}
            for member, queue in [key for key in open_ if key[0] == op.process and key[1][1] not in held]:
                begun, ended = open_.pop((member, queue))
                stretches[queue].append((begun, ended, member))
    for (member, queue), (begun, ended) in open_.items():
        stretches[queue].append((begun, ended, member))
    verdict.counts["group_delivered"] += sum(delivered.values())
    verdict.counts["group_delivered_again"] += sum(n - 1 for n in delivered.values())
    for (topic, queue_id), spans in sorted(stretches.items()):
        for (a_from, a_to, a), (b_from, b_to, b) in itertools.combinations(sorted(spans), 2):
            if a != b and b_from < a_to and a_from < b_to:
                verdict.anomaly("two members at once", f"{topic}/{queue_id}: {a} {a_from:.3f}-{a_to:.3f}, "
                                                       f"{b} {b_from:.3f}-{b_to:.3f}")


def faults(ops: list[Op]) -> list[tuple[str, float, float]]:
    """Each fault of the history: (name, started, healed)."""
    found: list[tuple[str, float, float]] = []
    started: dict[str, tuple[str, float]] = {}
    for op in ops:
        if op.process != "nemesis":
            continue
        if op.outcome == "start":
            started[op.f + op.value] = (f"{op.f} {op.value}".strip(), op.began_s)
        elif op.outcome == "heal" and op.f + op.value in started:
            name, began = started.pop(op.f + op.value)
            found.append((name, began, op.began_s))
    return found


def first_acknowledgement(ops: list[Op]) -> list[tuple[str, float]]:
    """For each fault, from its start to the acknowledgement of the first send begun after it (what
    a client that sends once the fault has begun waits); to the end of the history if none."""
    acked = sorted((op.began_s, op.ended_s) for op in ops if op.f == "send" and op.outcome == "ok")
    end = max((op.ended_s for op in ops), default=0.0)
    found = []
    for name, began, _healed in faults(ops):
        after = [ended for sent, ended in acked if sent >= began]
        found.append((name, (min(after) if after else end) - began))
    return found


def unavailable(ops: list[Op]) -> list[tuple[str, float]]:
    """For each fault (start .. heal), the longest time without an acknowledged send from its
    start to the first acknowledgement after its heal (to the end of the history if none)."""
    acks = sorted(op.ended_s for op in ops if op.f == "send" and op.outcome == "ok")
    end = max((op.ended_s for op in ops), default=0.0)
    found = []
    for name, began, healed in faults(ops):
        k = bisect.bisect_left(acks, began)
        after_heal = bisect.bisect_left(acks, healed)
        stop = acks[after_heal] if after_heal < len(acks) else max(end, healed)
        times = [began, *acks[k:after_heal + 1], stop]
        found.append((name, max((b - a for a, b in itertools.pairwise(times)), default=0.0)))
    return found
