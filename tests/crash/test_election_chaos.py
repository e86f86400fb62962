"""Seeded faults on a broker set elected on etcd under load: actors (the membership actor
included), whole masters, paused masters and etcd members; nothing acknowledged is lost."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.election_chaos import run_election_chaos
from supervisor.etcd_server import ETCD
from tests.helpers import require

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def test_eight_seeded_faults_on_an_elected_set_lose_nothing(tmp_path: Path) -> None:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    report = run_election_chaos(tmp_path, seed=2, cycles=8)
    print(report.summary(), report.schedule)
    assert report.ok, report.summary() + "\n" + "\n".join(map(str, report.findings))
    assert report.verdict is not None and report.verdict.acked > 1000
    assert len(report.epochs) >= 2  # the seed's schedule kills and pauses masters: there were elections
    assert [epoch for epoch, _ in report.epochs] == list(range(1, len(report.epochs) + 1))  # one claim an epoch
