"""Units written a dispatch batch at a time (``codec.cq_put_packed`` over the reput dispatcher's packed
entries) against ``ConsumeQueue.put`` record by record: the same files, the same ends, every file
written counted for the next flush."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from msgspec.structs import astuple

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


def put_batch(impl, batch: list[DispatchEntry], min_offset: int, store: Path,
              queues: dict[tuple[str, int], ConsumeQueue]) -> set[ConsumeQueue]:
    """The owner's way (``OwnedQueues.apply_batch``): the codec writes what it can, ``put`` the rest."""
    written: set[ConsumeQueue] = set()
    packed, pos = packed_of(batch), 0
    while (pos := impl.cq_put_packed(packed, pos, min_offset, queues, written)) < len(packed):
        (topic, queue_id, queue_offset, clo, size, code, _ts, _keys), pos = impl.unpack_entry(packed, pos)
        open_queue(store, queues, topic, queue_id).put(queue_offset, clo, size, code)
    return written


def packed_of(entries: list[DispatchEntry]) -> bytes:
    return b"".join(py.pack_entry(astuple(entry)) for entry in entries)  # type: ignore[arg-type]


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
        written = put_batch(impl, batch, min_offset, many, by_batch)
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
    entries = packed_of([DispatchEntry("t", 0, n, n * 100, 100, 7, 0, []) for n in range(1, 4)])
    written: set[ConsumeQueue] = set()
    assert impl.cq_put_packed(entries, 0, 0, queues, written) == len(entries) and written == {cq}
    assert cq.max_offset == 4 and cq.max_physical_end == 400
    assert [p.name for p in cq.take_unsynced()] == ["00000000000000000000"]
    more = packed_of([DispatchEntry("t", 0, 4, 400, 100, 7, 0, [])])
    assert impl.cq_put_packed(more, 0, 0, queues, set()) == 0, "after a flush the next write counts its file again"
    cq.put(4, 400, 100, 7)
    assert [p.name for p in cq.take_unsynced()] == ["00000000000000000000"]
    cq.put(5, 500, 100, 7)
    assert cq.window is not None
    cq.window.close()  # unmapped (a mapping evicted): never written through
    assert impl.cq_put_packed(packed_of([DispatchEntry("t", 0, 6, 600, 100, 7, 0, [])]), 0, 0, queues, set()) == 0
    cq.close()


@pytest.mark.skipif(c is None, reason="engine._codec is not built")
def test_arguments_that_are_not_packed_entries_a_dict_and_a_set_are_refused(tmp_path: Path) -> None:
    queues: dict[tuple[str, int], ConsumeQueue] = {}
    cq = open_queue(tmp_path, queues, "t", 0)
    cq.put(0, 0, 100, 0)
    for bad in ([DispatchEntry("t", 0, 1, 100, 100, 0, 0, [])], bytearray(b"x")):  # packed entries are bytes
        with pytest.raises(TypeError):
            c.cq_put_packed(bad, 0, 0, queues, set())
    with pytest.raises(TypeError):
        c.cq_put_packed(b"", 0, 0, [], set())
    with pytest.raises(TypeError):
        c.cq_put_packed(b"", 0, 0, {}, [])
    with pytest.raises(ValueError):
        c.cq_put_packed(b"", -1, 0, {}, set())
    with pytest.raises(TypeError):
        c.unpack_entry(bytearray(45), 0)
    assert cq.max_offset == 1
    cq.close()


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_a_torn_packed_batch_is_refused_and_what_was_written_stays_counted(tmp_path: Path, impl) -> None:
    whole = b"".join(py.pack_entry(("t", 0, n, n * 100, 100, 7, 0, [])) for n in range(1, 4))
    for cut in (len(whole) - 1, len(whole) - py.PACKED_ENTRY.size + 3):  # in the last topic, in its head
        queues: dict[tuple[str, int], ConsumeQueue] = {}
        cq = open_queue(tmp_path / str(cut), queues, "t", 0)
        cq.put(0, 0, 100, 0)
        with pytest.raises(ValueError, match="runs past the end"):
            impl.cq_put_packed(whole[:cut], 0, 0, queues, written := set())
        assert written == {cq} and cq.max_offset == 3, "the two whole entries before the torn one are written"
        cq.close()
    with pytest.raises(ValueError, match="runs past the end"):
        impl.unpack_entry(whole, len(whole) - 1)
    with pytest.raises(ValueError, match="runs past the end"):
        impl.unpack_entry(whole, -1)


OWNER_WRITER = """
import sys
from pathlib import Path
from engine.config import StoreConfig
from engine.codec_py import pack_entry
from engine.ipc.messages import DispatchBatch
from engine.services.owner.owned_queues import OwnedQueues
from tests.unit.test_cq_batch import owner_entries
config = StoreConfig.test_min().replace(consume_queue_owner_count=1, consume_queue_file_units={file_units},
                                        consume_queue_reserve_step_bytes=4096)
owner = OwnedQueues(Path(sys.argv[1]), config, 0)
print("started", flush=True)
log = owner_entries({records})
for first in range(0, {records}, 500):  # the owner's way: a DispatchBatch at a time (apply_batch)
    entries = log[first:first + 500]
    owner.apply_batch(DispatchBatch(entries[0][3], entries[-1][3] + 100, b"".join(map(pack_entry, entries))))
"""


def owner_entries(records: int) -> list[tuple]:
    """Records of 4 queues of 2 topics in a fixed interleaving, 100 bytes each."""
    queues = [("a", 0), ("a", 1), ("bb", 0), ("bb", 3)]
    next_offset = dict.fromkeys(queues, 0)
    entries = []
    for n in range(records):
        queue = queues[(n * 7 + n // 3) % 4]
        entries.append((*queue, next_offset[queue], n * 100, 100, n % 97, 1_700_000_000_000 + n, []))
        next_offset[queue] += 1
    return entries


@pytest.mark.skipif(c is None, reason="engine._codec is not built")
def test_an_owner_killed_in_the_middle_of_its_batches_leaves_the_units_put_writes_record_by_record(
        tmp_path: Path) -> None:
    """SIGKILL an owner's batch path (``OwnedQueues.apply_batch``, on ``cq_put_packed``) at a random
    moment: what its queues hold is a prefix of the log's records, the same for every queue, and
    byte for byte what ``ConsumeQueue.put`` writes record by record for that prefix."""
    import subprocess
    import sys
    import time

    from engine.store.consume_queue import list_queues

    records, file_units = 120_000, 4_000
    entries = owner_entries(records)
    store = tmp_path / "killed"
    script = OWNER_WRITER.format(file_units=file_units, records=records)
    writer = subprocess.Popen([sys.executable, "-c", script, str(store)], cwd=Path(__file__).resolve().parents[2],
                              stdout=subprocess.PIPE)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"started\n"
        target, deadline = random.randrange(1_000, records // 2), time.monotonic() + 60  # a new moment each run
        while writer.poll() is None:  # until the queues hold about `target` units
            assert time.monotonic() < deadline
            held = 0
            for topic, queue_id in list_queues(store):
                reader = ConsumeQueue(store, topic, queue_id, file_units=file_units, writable=False)
                held += reader.max_offset
                reader.files.close()
            if held > target:
                writer.kill()
        assert writer.wait(30) == -9, f"killed before it applied every record (about {target} units)"
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        writer.stdout.close()  # type: ignore[union-attr]
    held = {}
    for topic, queue_id in list_queues(store):  # opened as the owner's restart opens them
        cq = ConsumeQueue(store, topic, queue_id, file_units=file_units, writable=True, reserve_step_bytes=4096)
        held[(topic, queue_id)] = cq.max_offset
        cq.close()
    # The prefix: every record up to the last one any queue holds, and each queue holds all of its own in it.
    last = max(i for i, entry in enumerate(entries) if entry[2] < held.get(entry[:2], 0))
    prefix = entries[:last + 1]
    for queue, count in held.items():
        assert count == sum(1 for entry in prefix if entry[:2] == queue), f"{queue}: not a prefix of the log"
    expected = tmp_path / "expected"
    by_record: dict[tuple[str, int], ConsumeQueue] = {}
    for topic, queue_id, queue_offset, log_offset, size, tags_code, *_ in prefix:
        cq = by_record.get((topic, queue_id))
        if cq is None:
            cq = by_record[(topic, queue_id)] = ConsumeQueue(expected, topic, queue_id, file_units=file_units,
                                                             writable=True, reserve_step_bytes=4096)
        cq.put(queue_offset, log_offset, size, tags_code)
    for cq in by_record.values():
        cq.close()

    def units(root: Path) -> dict[str, bytes]:  # a file created and never written holds no unit
        return {name: data for name, data in files_of(root).items() if data.strip(b"\0")}

    assert units(store) == units(expected), f"{len(prefix)} records"
