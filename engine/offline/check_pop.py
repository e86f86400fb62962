"""``check_pop_state``: verify the pop groups' ack state offline (``engine/store/pop_files.py``).

For every ``pop/{group}/{topic}/{queue}/``:

* the journal is whole entries, each passing its CRC (a torn tail is reported; the
  owner cuts it when it starts);
* every segment file is the segment it is named for, with its entries' CRC and its
  header's counts right, and every state known;
* journal and segments agree: replayed in order over the segments, an ack, change or
  dead-letter entry only ever names an offset that was delivered;
* nothing is recorded for an offset at or past the queue's end (a message that does
  not exist cannot have been delivered).
"""

from __future__ import annotations

from pathlib import Path

from engine.names import is_decimal
from engine.store.consume_queue import ConsumeQueue
from engine.store.pop_files import (
    ACTION_STATE,
    DONE_STATES,
    JOURNAL_FILE,
    POP_DIR,
    SEGMENT_ENTRY,
    SEGMENT_ENTRY_COUNT,
    SEGMENT_HEADER,
    Action,
    SegmentError,
    State,
    decode_segment,
    is_leftover,
    read_journal,
    segment_numbers,
    segment_path,
)

PopFinding = tuple[str, str]  # where, problem
_KNOWN_STATES = frozenset(State)
_NEEDS_DELIVERY = (Action.ACK, Action.CHANGE, Action.DEAD)


def check_pop_state(store_dir: Path, queues: dict[tuple[str, int], ConsumeQueue],
                    deletion_offsets: dict[str, int]) -> list[PopFinding]:
    """A queue's state made before its topic's last deletion is a leftover (its owner removes it
    when it starts) and is not checked."""
    findings: list[PopFinding] = []
    for directory in sorted((store_dir / POP_DIR).glob("*/*/*")):
        group, topic, queue = directory.parts[-3:]
        if not is_decimal(queue):
            findings.append((str(directory), "not a queue directory"))
            continue
        if is_leftover(directory, deletion_offsets):
            continue
        cq = queues.get((topic, int(queue)))
        findings.extend(check_pop_queue(directory, cq.max_offset if cq else 0, f"{group}/{topic}/{queue}"))
    return findings


def check_pop_queue(directory: Path, queue_end: int, where: str) -> list[PopFinding]:
    findings: list[PopFinding] = []
    states: dict[int, int] = {}  # offset -> state, from the segments, then the journal replayed over them
    for number in segment_numbers(directory):
        try:
            data = segment_path(directory, number).read_bytes()
            entries = decode_segment(data, number)
        except (SegmentError, OSError) as exc:
            findings.append((f"{where} segment {number}", str(exc)))
            continue
        header = SEGMENT_HEADER.unpack_from(data)
        open_count = done_count = 0
        for index, (_until, _generation, _attempt, state, _) in enumerate(SEGMENT_ENTRY.iter_unpack(entries)):
            if state == State.NONE:
                continue
            offset = number * SEGMENT_ENTRY_COUNT + index
            states[offset] = state
            if state not in _KNOWN_STATES:
                findings.append((f"{where} offset {offset}", f"unknown state {state}"))
            open_count += state == State.DELIVERED
            done_count += state in DONE_STATES
        if (header[4], header[5]) != (open_count, done_count):
            findings.append((f"{where} segment {number}",
                                    f"header counts {header[4]} open / {header[5]} done, entries say "
                                    f"{open_count} / {done_count}"))
    data = (directory / JOURNAL_FILE).read_bytes() if (directory / JOURNAL_FILE).exists() else b""
    replay = read_journal(data)
    if replay.valid_bytes != len(data):
        findings.append((f"{where} journal", f"torn tail: {len(data) - replay.valid_bytes} bytes past "
                                                           f"the last intact entry (cut when its owner starts)"))
    if replay.damaged_entries:
        findings.append((f"{where} journal", f"{replay.damaged_entries} damaged entries mid-journal"))
    for entry in replay.entries:
        if entry.action in _NEEDS_DELIVERY and states.get(entry.queue_offset) != State.DELIVERED:
            findings.append((f"{where} offset {entry.queue_offset}",
                                    f"the journal records {entry.action.name} for an offset that is not delivered "
                                    f"(state {State(states.get(entry.queue_offset, 0)).name})"))
        if entry.action != Action.CHANGE:
            states[entry.queue_offset] = ACTION_STATE[entry.action]
    beyond = [offset for offset, state in states.items()
              if offset >= queue_end and state not in (State.SKIPPED, State.NONE)]
    if beyond:
        findings.append((where, f"{len(beyond)} offsets at or past the queue's end ({queue_end}) have "
                                              f"a delivery state, first {min(beyond)}"))
    return findings

