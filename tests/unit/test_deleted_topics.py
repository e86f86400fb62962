"""The deleted-topic table: what it hides, how it persists, when it forgets."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.store.deleted_topics import DELETED_TOPICS_FILE, DeletedTopics

pytestmark = pytest.mark.timeout(30)


def test_hides_only_the_topics_records_below_its_deletion_offset(tmp_path: Path) -> None:
    table = DeletedTopics(tmp_path)
    assert not table and not table.hides("orders", 0)
    table.record("orders", 1000)
    assert table.hides("orders", 999)
    assert not table.hides("orders", 1000)  # a topic of the same name created later
    assert not table.hides("other", 10)


def test_persists_atomically_and_reloads_on_a_new_generation(tmp_path: Path) -> None:
    writer = DeletedTopics(tmp_path)
    reader = DeletedTopics(tmp_path)
    assert reader.follow(0) == {}
    writer.record("a", 10)
    assert reader.follow(1) == {}, "recorded in memory only: not saved yet"
    writer.save()
    assert reader.follow(1) == {}  # the generation did not move: no reload
    assert reader.follow(2) == {"a": 10}
    writer.record("a", 20)
    writer.save()
    writer.record("b", 5)
    writer.save()
    assert reader.follow(3) == {"a": 20, "b": 5}
    (tmp_path / DELETED_TOPICS_FILE).write_bytes(b"{torn")  # the .bak copy serves
    assert DeletedTopics(tmp_path).deletion_offsets == {"a": 20}


def test_a_deletion_that_could_not_be_saved_is_taken_back(tmp_path: Path) -> None:
    table = DeletedTopics(tmp_path)
    table.record("a", 100)
    table.save()
    table.record("a", 200)
    table.record("b", 50)
    table.undo("b", None)
    table.undo("a", 100)
    assert table.deletion_offsets == {"a": 100} == DeletedTopics(tmp_path).deletion_offsets


def test_forgets_entries_once_retention_passed_them(tmp_path: Path) -> None:
    table = DeletedTopics(tmp_path)
    table.record("a", 100)
    table.record("b", 300)
    assert table.forget_below(200) == 1
    assert DeletedTopics(tmp_path).deletion_offsets == {"b": 300}
    assert table.forget_below(200) == 0


def test_a_deletion_offset_never_moves_back(tmp_path: Path) -> None:
    table = DeletedTopics(tmp_path)
    table.record("a", 100)
    with pytest.raises(AssertionError):
        table.record("a", 50)


def test_a_deletion_past_the_recovered_end_of_the_log_comes_down_to_it(tmp_path: Path) -> None:
    """A power cut took the log's tail after the deletion was saved: the deletion must not hide
    the records that a topic of the same name gets at those offsets again."""
    table = DeletedTopics(tmp_path)
    table.record("gone", 5_000)
    table.record("older", 1_000)
    table.save()
    assert table.clamp_to(3_000) == ["gone"]
    assert table.deletion_offsets == {"gone": 3_000, "older": 1_000}
    assert not table.hides("gone", 3_000) and table.hides("gone", 2_999)
    assert table.clamp_to(3_000) == []
