"""The wire between actors is the one declared in ``engine/ipc/channels.py``: the docs print it,
and no actor names a port by a string or reads a frame by its position."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from engine.ipc import channels, wire
from engine.ipc.messages import PLAIN, Answered, Append, PopElsewhere, Pull, Routed, TopicDeletion, Wake, encoder

ROOT = Path(__file__).resolve().parents[2]
# Where messages between actors are built and taken; engine/ipc/wire.py alone lays out frames.
ACTOR_CODE = sorted([*ROOT.glob("engine/actors/*.py"), *ROOT.glob("engine/services/**/*.py")])
EFFECT_CALLS = {"Port", "Reply", "Tell", "Publish", "reply", "publish", "send", "Send", "Forward"}

pytestmark = pytest.mark.timeout(30)


def test_design_doc_holds_the_channel_table_the_code_declares():
    text = (ROOT / "docs/design.md").read_text()
    found = re.search(r"<!-- channels: generated[^\n]*\n(.*?)<!-- end of channels -->", text, re.S)
    assert found, "docs/design.md lost its generated channel table"
    assert found.group(1) == channels.table(), "run `python -m engine.ipc.channels` and paste its table"


def _offences(path: Path) -> list[str]:
    offences = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "frames":
            offences.append(f"{where}: a frame read by position (decode it in engine/ipc/wire.py)")
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in EFFECT_CALLS:
                offences.append(f"{where}: {name}() given a port by its name (give a channel)")
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id in ("port", "channel") \
                and any(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in node.comparators):
            offences.append(f"{where}: a port compared with a string (compare channels)")
        if isinstance(node, ast.FunctionDef) and node.name in ("handle", "handle_from"):
            offences.append(f"{where}: a handler by port (register handlers by message type)")
    return offences


def test_no_actor_names_a_port_by_string_or_reads_a_frame_by_position():
    offences = [offence for path in ACTOR_CODE for offence in _offences(path)]
    assert not offences, "\n".join(offences)


def test_the_rule_catches_what_it_forbids(tmp_path):
    bad = ROOT / "engine/actors" / "_wire_rule_probe.py"
    try:
        bad.write_text('def handle(port, frames, out):\n    out.send("requests", [frames[0]])\n'
                       '    if port == "writer":\n        pass\n')
        assert len(_offences(bad)) == 4
    finally:
        bad.unlink()


def test_routed_request_and_answer_round_trip_through_the_wire():
    owner = channels.owner(1)
    frames = wire.request_frames(owner, Routed(b"client-7", PLAIN, Pull()), b"raw pull")
    inbound = wire.decode(owner, True, [b"front-id", *frames])
    assert isinstance(inbound.body, Pull) and inbound.payload == b"raw pull"
    assert inbound.origin == wire.Origin(owner, b"front-id", b"client-7", PLAIN)
    reply = wire.reply_frames(inbound.origin, b"raw pop", PopElsewhere([(2, [0])]))
    assert reply[0] == b"front-id"
    answer = wire.decode(owner, False, reply[1:])
    assert answer.body == Answered(b"client-7", PLAIN, PopElsewhere([(2, [0])])) and answer.payload == b"raw pop"


def test_a_message_its_channel_does_not_declare_is_refused():
    with pytest.raises(AssertionError, match="not declared"):
        wire.request_frames(channels.WRITER, Routed(b"c", PLAIN, Pull()), b"")  # a pull to the writer
    with pytest.raises(AssertionError, match="not declared"):
        wire.decode(channels.WRITER, True, [b"front", encoder.encode(Routed(b"c", PLAIN, Pull())), b""])
    with pytest.raises(AssertionError, match="not declared"):  # a note the transaction actor never gives
        wire.reply_frames(wire.Origin(channels.TRANSACTIONS, b"front", b"c"), b"", TopicDeletion("t", True))
    with pytest.raises(AssertionError, match="not declared"):
        wire.decode(channels.DISPATCH, False, [b"ix", encoder.encode(Wake())])
    assert wire.decode(channels.WRITER, True, [b"f", encoder.encode(Routed(b"c", PLAIN, Append(0, 0))), b""])


def test_client_frames_keep_their_delimiter_and_bad_layouts_are_dropped():
    inbound = wire.decode(channels.CLIENTS, True, [b"id", b"", b"req"], b"\x7f\0\0\1")
    assert inbound.origin.flag == 1 and inbound.peer_ip == b"\x7f\0\0\1"
    assert wire.reply_frames(inbound.origin, b"rep") == [b"id", b"", b"rep"]
    with pytest.raises(wire.WireError):
        wire.decode(channels.CLIENTS, True, [b"id", b"x", b"y", b"z"])


def test_only_the_declared_actors_open_a_channel():
    assert channels.WRITER.opened_by("writer", bind=True)
    assert channels.WRITER.opened_by("owner-3", bind=False)
    assert not channels.WRITER.opened_by("timer", bind=False)
    assert channels.owner(2).opened_by("owner-2", bind=True)
    assert not channels.DISPATCH.opened_by("front", bind=False)
