"""Units written a dispatch batch at a time (``codec.cq_put_entries``) against ``ConsumeQueue.put``
record by record: the same files, the same ends, every file written counted for the next flush."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine import codec_py as py
from engine.ipc.messages import DispatchEntry
from engine.store.consume_queue import ConsumeQueue

try:
    from engine import _codec as c
except ImportError:
    c = None

pytestmark = pytest.mark.timeout(60)
IMPLS = [py] + ([c] if c is not None else [])
FILE_UNITS = 50


def batches(seed: int) -> list[list[DispatchEntry]]:
    """Records of 5 queues of 2 topics interleaved, with gaps, replays of earlier records and
    queues crossing file boundaries; cut into batches of uneven sizes."""
    rng = random.Random(seed)
    next_offset = {(t, q): 0 for t in ("a", "bb") for q in range(3) if (t, q) != ("bb", 2)}
    entries: list[DispatchEntry] = []
    log = 0
    for _ in range(700):
        if entries and rng.random() < 0.05:
            entries.append(rng.choice(entries))  # a replay: already in its queue
            continue
        topic, queue_id = rng.choice(list(next_offset))
        if rng.random() < 0.03:
            next_offset[(topic, queue_id)] += rng.randint(1, 4)  # a gap: blank units fill it
        size = rng.randint(60, 400)
        entries.append(DispatchEntry(topic, queue_id, next_offset[(topic, queue_id)], log, size, rng.randint(0, 99), 0,
                                     []))
        next_offset[(topic, queue_id)] += 1
        log += size
    cuts = sorted(rng.sample(range(1, len(entries)), 12))
    return [entries[a:b] for a, b in zip([0, *cuts], [*cuts, len(entries)], strict=True)]


def open_queue(store: Path, queues: dict[tuple[str, int], ConsumeQueue], topic: str, queue_id: int) -> ConsumeQueue:
    cq = queues.get((topic, queue_id))
    if cq is None:
        cq = queues[(topic, queue_id)] = ConsumeQueue(store, topic, queue_id, file_units=FILE_UNITS, writable=True,
                                                      reserve_step_bytes=4096)
    return cq


def files_of(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_batch_writes_the_units_put_writes_record_by_record(tmp_path: Path, impl, seed: int) -> None:
    one, many = tmp_path / "one", tmp_path / "many"
    by_record: dict[tuple[str, int], ConsumeQueue] = {}
    by_batch: dict[tuple[str, int], ConsumeQueue] = {}
    min_offset = 0
    synced_files: set[str] = set()
    for n, batch in enumerate(batches(seed)):
        for entry in batch:
            if entry.commit_log_offset >= min_offset:
                open_queue(one, by_record, entry.topic, entry.queue_id).put(
                    entry.queue_offset, entry.commit_log_offset, entry.size, entry.tags_code)
        written: set[ConsumeQueue] = set()
        i = 0
        while (i := impl.cq_put_entries(batch, i, min_offset, by_batch, written)) < len(batch):
            entry = batch[i]
            open_queue(many, by_batch, entry.topic, entry.queue_id).put(
                entry.queue_offset, entry.commit_log_offset, entry.size, entry.tags_code)
            i += 1
        assert all(by_batch[(cq.topic, cq.queue_id)] is cq for cq in written)
        if n % 3 == 2:  # a flush between batches: what it covers is what was written since the last one
            for cq in by_batch.values():
                synced_files.update(str(p.relative_to(many)) for p in cq.take_unsynced())
        min_offset = batch[-1].commit_log_offset // 2  # the next batch's replayed prefix is skipped
    for cq in by_batch.values():
        synced_files.update(str(p.relative_to(many)) for p in cq.take_unsynced())
    for key, cq in by_record.items():
        assert (cq.max_offset, cq.max_physical_end) == (by_batch[key].max_offset, by_batch[key].max_physical_end)
    for queues in (by_record, by_batch):
        for cq in queues.values():
            cq.close()
    assert files_of(one) == files_of(many)
    assert synced_files == set(files_of(many)), "every file written is flushed"


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_a_window_closed_by_a_flush_or_an_unmapping_leaves_the_unit_to_put(tmp_path: Path, impl) -> None:
    queues: dict[tuple[str, int], ConsumeQueue] = {}
    cq = open_queue(tmp_path, queues, "t", 0)
    cq.put(0, 0, 100, 0)
    entries = [DispatchEntry("t", 0, n, n * 100, 100, 7, 0, []) for n in range(1, 4)]
    written: set[ConsumeQueue] = set()
    assert impl.cq_put_entries(entries, 0, 0, queues, written) == 3 and written == {cq}
    assert cq.max_offset == 4 and cq.max_physical_end == 400
    assert [p.name for p in cq.take_unsynced()] == ["00000000000000000000"]
    more = [DispatchEntry("t", 0, 4, 400, 100, 7, 0, [])]
    assert impl.cq_put_entries(more, 0, 0, queues, set()) == 0, "after a flush the next write counts its file again"
    cq.put(4, 400, 100, 7)
    assert [p.name for p in cq.take_unsynced()] == ["00000000000000000000"]
    cq.put(5, 500, 100, 7)
    assert cq.window is not None
    cq.window.close()  # unmapped (a mapping evicted): never written through
    assert impl.cq_put_entries([DispatchEntry("t", 0, 6, 600, 100, 7, 0, [])], 0, 0, queues, set()) == 0
    cq.close()


@pytest.mark.skipif(c is None, reason="engine._codec is not built")
def test_bad_entries_are_refused_and_what_was_written_stays_counted(tmp_path: Path) -> None:
    queues: dict[tuple[str, int], ConsumeQueue] = {}
    cq = open_queue(tmp_path, queues, "t", 0)
    cq.put(0, 0, 100, 0)
    written: set[ConsumeQueue] = set()
    with pytest.raises(AttributeError):
        c.cq_put_entries([DispatchEntry("t", 0, 1, 100, 100, 0, 0, []), object()], 0, 0, queues, written)
    assert written == {cq} and cq.max_offset == 2 and cq.max_physical_end == 200
    with pytest.raises(TypeError):
        c.cq_put_entries([], 0, 0, [], set())
    with pytest.raises(TypeError):
        c.cq_put_entries([], 0, 0, {}, [])
    cq.close()
