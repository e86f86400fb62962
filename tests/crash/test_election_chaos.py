"""Seeded faults on a broker set elected on etcd under load: actors (the membership actor
included), whole masters and replicas, paused masters and etcd members; nothing acknowledged is
lost, and nothing a consumer read changes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.election_chaos import run_election_chaos
from supervisor.etcd_server import ETCD
from tests.helpers import require

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


@pytest.mark.parametrize("seed", [
    2,  # masters killed and paused, actors (the membership actor), an etcd member
    4,  # masters and a replica killed, an etcd member, the receiver and the reput of a master
])
def test_eight_seeded_faults_on_an_elected_set_lose_nothing(tmp_path: Path, seed: int) -> None:
    require(shutil.which(ETCD) is not None, "etcd (Debian's etcd-server)")
    report = run_election_chaos(tmp_path, seed=seed, cycles=8)
    print(report.summary(), report.schedule)
    assert report.ok, report.summary() + "\n" + "\n".join(map(str, report.findings))
    assert report.verdict is not None and report.verdict.acked > 1000
    assert len(report.epochs) >= 2  # the seed's schedule kills and pauses masters: there were elections
    assert [epoch for epoch, _ in report.epochs] == list(range(1, len(report.epochs) + 1))  # one claim an epoch
