"""Epochs and the cut of a forked log (engine/store/epoch_file.py, engine/offline/truncate.py), and the
choice of a candidate (engine/coordination/broker_set.py): the rules, then a real store cut and
recovered by the engine's own recovery plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import StoreConfig
from engine.coordination.broker_set import choose
from engine.coordination.role import Role, mask, members_of
from engine.offline.check import check_store
from engine.offline.truncate import ABORT_MARKER, fork_point, truncate_log
from engine.services.recovery import plan_commit_log_recovery
from engine.store.commit_log import COMMIT_LOG_DIR
from engine.store.epoch_file import EPOCH_FILE, add_epoch, load_epochs, trim_epochs, truncation_point
from engine.store.unclean_stop import abort_note
from supervisor.launcher import EngineProcess

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(("local", "history", "point"), [
    ([], [(1, 0)], None),  # an empty store: nothing to cut
    ([(1, 0)], [(1, 0)], None),  # the current epoch: open
    ([(1, 0)], [(1, 0), (2, 500)], 500),  # the old master of epoch 1: cut where epoch 2 began
    ([(1, 0), (2, 400)], [(1, 0), (2, 500)], None),  # followed epoch 2 from 400, behind: all the set's
    ([(1, 0), (2, 500)], [(1, 0), (2, 500), (3, 900)], 900),  # followed 2, the set moved on at 900
    ([(1, 0), (2, 500), (3, 900)], [(1, 0), (2, 500), (3, 900)], None),
    ([(1, 0), (2, 700)], [(1, 0), (2, 500), (3, 900)], 500),  # 1 wrote past its end here: cut at 500
    ([(1, 0), (4, 700)], [(1, 0), (2, 500)], 500),  # an epoch the set never had: cut at 1's end first
])
def test_truncation_point(local: list[tuple[int, int]], history: list[tuple[int, int]], point: int | None) -> None:
    assert truncation_point(local, history) == point


def test_an_epoch_the_set_never_had_is_cut_at_its_start() -> None:
    assert truncation_point([(3, 800)], [(1, 0), (2, 500)]) == 800


def test_choose_takes_the_longest_log_then_the_lowest_id() -> None:
    assert choose({0: 100, 1: 300, 2: 300}) == 1
    assert choose({2: 5}) == 2
    assert members_of(mask([0, 3, 62])) == [0, 3, 62]


def test_epoch_file_round_trip(tmp_path: Path) -> None:
    add_epoch(tmp_path, 1, 0)
    add_epoch(tmp_path, 3, 4096)
    add_epoch(tmp_path, 2, 9999)  # older than the last: ignored
    assert load_epochs(tmp_path) == [(1, 0), (3, 4096)]
    assert trim_epochs(load_epochs(tmp_path), 4096) == [(1, 0)]
    role = Role("replica", 3, 1, "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", [(1, 0), (3, 4096)])
    role.save(tmp_path)
    assert Role.load(tmp_path) == role


def test_a_cut_store_recovers_to_the_cut(tmp_path: Path) -> None:
    config = StoreConfig.test_min().replace(segment_size_bytes=1 << 20, message_body_bytes_max=64 * 1024,
                                            send_batch_bytes_max=256 * 1024)
    store = tmp_path / "store"
    with EngineProcess(store, config=config) as engine, engine.client() as client:
        results = []
        for n in range(60):  # about 2.4 MiB: three segments
            results += client.send("t", [{"body": bytes([n]) * 40_000}], queue_id=0)
    cut = results[30]["commit_log_offset"]
    assert not (store / ABORT_MARKER).exists()  # a clean stop
    assert truncate_log(store, cut) > 0
    assert (store / ABORT_MARKER).read_text() == "the log was cut\n"  # the next start recovers as after a crash
    note = abort_note()
    (store / ABORT_MARKER).write_text(note)  # a running supervisor's, with this boot's id: it stays
    assert truncate_log(store, results[29]["commit_log_offset"]) > 0
    assert (store / ABORT_MARKER).read_text() == note
    cut = results[29]["commit_log_offset"]
    assert truncate_log(store, cut) == 0  # nothing past it any more
    plan = plan_commit_log_recovery(store, engine.config, unclean=True)
    assert plan.end_offset == cut
    assert plan.next_queue_offsets[("t", 0)] == 29
    with EngineProcess(store, config=config) as engine, engine.client() as client:
        [stored] = client.send("t", [{"body": b"after the cut"}], queue_id=0)
        assert (stored["queue_offset"], stored["commit_log_offset"]) == (29, cut)
        bodies = []
        while len(bodies) < 30:
            page = client.pull("t", 0, len(bodies), max_messages=32, max_wait_ms=1_000)
            bodies += [m["body"] for m in page["messages"]]
        assert page["max_offset"] == 30  # the units past the cut are gone, not served
        assert [body[0] for body in bodies[:29]] == list(range(29)) and bodies[29] == b"after the cut"
    assert check_store(store, engine.config) == []
    (store / EPOCH_FILE).write_text("3 0\n2 100\n4 999999999\n")  # an epoch going back, one past the log
    problems = [finding.problem for finding in check_store(store, engine.config) if finding.area == "epochs"]
    assert problems[0] == "epoch 2 at 100 follows epoch 3 at 0"
    assert problems[1].startswith("epoch 4 begins at 999999999, past the log's end") and len(problems) == 2


def test_a_segment_reserved_ahead_is_not_data_past_a_fork(tmp_path: Path) -> None:
    """The writer reserves the next segment ahead of the log (zeros, a page of it allocated): it
    holds no record, so a replica whose log ends where the new epoch begins does not fork, and
    is not cut (which would restart every actor of it as after a crash)."""
    store = tmp_path / "store"
    segments = store / COMMIT_LOG_DIR
    segments.mkdir(parents=True)
    (segments / f"{0:020d}").write_bytes(b"\x01" * 1000 + bytes(8192 - 1000))
    (segments / f"{8192:020d}").write_bytes(bytes(4096))
    add_epoch(store, 1, 0)
    follows = Role("replica", 2, 0, "tcp://a:1", "tcp://a:2", [(1, 0), (2, 1000)])
    assert fork_point(store, follows) is None
    assert truncate_log(store, 1000) == 0
    forked = Role("replica", 2, 0, "tcp://a:1", "tcp://a:2", [(1, 0), (2, 600)])
    assert fork_point(store, forked) == 600
    assert truncate_log(store, 600) > 0
    assert fork_point(store, forked) is None  # cut: nothing past it now
