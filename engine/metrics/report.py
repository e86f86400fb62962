"""How an actor hands its figures to the monitor: a report file, replaced whole.

Every ``metrics_report_interval_ms`` the runtime asks the actor for its figures
(``Actor.metrics``) and writes them, msgpack-encoded, to ``RUN/metrics/NAME.msgpack``:
a write to a temporary file and a rename, so a reader sees the old report or the new
one, never half of one. The monitor reads them when it is scraped. Nothing is shared
and nothing is locked: an actor's hot loop only bumps its own counters (a dict entry
or a list slot), and the file costs three syscalls a second, whatever the load.

    Report {actor, pid, written_ms,
            samples:    {family: [[label value, ..., value], ...]},
            histograms: {family: {counts: [n per bound of LATENCY_BOUNDS_S, then +Inf], sum_s}}}
"""

from __future__ import annotations

import os
from bisect import bisect_left
from pathlib import Path
from typing import Any

import msgspec

from engine.metrics.families import LATENCY_BOUNDS_S

REPORTS_DIR = "metrics"
Figures = dict[str, Any]  # family -> rows of [label values..., value], or a Histogram


class Histogram(msgspec.Struct):
    counts: list[int]
    sum_s: float = 0.0

    @classmethod
    def new(cls) -> Histogram:
        return cls([0] * (len(LATENCY_BOUNDS_S) + 1))

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BOUNDS_S, seconds)] += 1
        self.sum_s += seconds


class Report(msgspec.Struct):
    actor: str
    pid: int
    written_ms: int
    samples: dict[str, list[list[Any]]] = {}
    histograms: dict[str, Histogram] = {}


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Report)


def per_queue(counts: dict[tuple[str, int], int]) -> list[list[Any]]:
    """Rows of a per-queue family from ``{(topic, queue id): value}``."""
    return [[topic, str(queue_id), value] for (topic, queue_id), value in counts.items()]


class Reporter:
    """Writes one actor's reports into the run directory."""

    def __init__(self, run_dir: Path, actor: str) -> None:
        self.dir = run_dir / REPORTS_DIR
        self.dir.mkdir(exist_ok=True)
        self.actor = actor
        self.path = self.dir / f"{actor}.msgpack"
        self.scratch = self.dir / f".{actor}.tmp"

    def write(self, figures: Figures, now_ms: int) -> None:
        report = Report(self.actor, os.getpid(), now_ms,
                        samples={k: v for k, v in figures.items() if not isinstance(v, Histogram)},
                        histograms={k: v for k, v in figures.items() if isinstance(v, Histogram)})
        self.scratch.write_bytes(_encoder.encode(report))
        os.replace(self.scratch, self.path)


def read_reports(run_dir: Path) -> list[Report]:
    """Every actor's latest report; one that cannot be read is left out (and not fatal)."""
    reports = []
    for path in sorted((run_dir / REPORTS_DIR).glob("*.msgpack")):
        try:
            reports.append(_decoder.decode(path.read_bytes()))
        except (OSError, msgspec.MsgspecError, ValueError, TypeError):
            continue
    return reports
