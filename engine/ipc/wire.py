"""The frames on the wire between actors, laid out in one place.

Every other module speaks in typed messages: a handler is given an ``Inbound`` (the decoded
message, the client frame that rides with it, and whom to answer), and gives back effects
(``engine/actors/effects.py``); this module turns the one into frames and frames into the
other, checking each message against its channel's declaration (``engine/ipc/channels.py``).
The runtime and the simulation both go through it.

The layouts, after ZeroMQ's own routing id (which a ROUTER receives first and sends first)::

    client channel   client -> front   [raw request]         ([b"", raw request] from a REQ socket)
                     front -> client   [raw reply]           ([b"", raw reply] to a REQ socket)
    routed channel   peer -> server    [Routed, raw request]
                     server -> peer    [Answered, raw reply] (the raw pop itself, with PopElsewhere)
    publication      PUB -> SUB        [topic, message]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from engine.ipc.channels import FRONT_INTERNAL, PUBLISH, Channel, ClientFrame
from engine.ipc.messages import (
    DIRECT,
    INTERNAL,
    PLAIN,
    REQ,
    Answered,
    Routed,
    answered_decoder,
    encoder,
    routed_decoder,
)

CLIENT_FRAME = ClientFrame()


class Origin(NamedTuple):
    """Whom to answer: the channel a request came in on, its sender's routing id, and for a
    routed request the client behind the front (its routing id and how it framed the request)."""

    channel: Channel
    peer: bytes
    client: bytes = b""
    flag: int = PLAIN


class Inbound(NamedTuple):
    """One message as a handler gets it."""

    channel: Channel
    body: object  # the typed message: a Routed's order, an Answered, a publication; CLIENT_FRAME
    payload: bytes = b""  # the client frame that rides with it
    origin: Origin | None = None  # on the binding side of a request channel: whom to answer
    peer_ip: bytes = b""  # the client's IP, on the client channel (4 or 16 bytes; b"" over ipc://)
    peer_key: str = ""  # the client's CURVE public key (Z85), on a CURVE client channel


class WireError(ValueError):
    """Frames that do not follow their channel's layout (only a client can send those)."""


_publication_decoders: dict[Channel, msgspec.msgpack.Decoder[Any]] = {}


def _publication_decoder(channel: Channel) -> msgspec.msgpack.Decoder[Any]:
    decoder = _publication_decoders.get(channel)
    if decoder is None:
        union = channel.answer[0]
        for kind in channel.answer[1:]:
            union = union | kind  # type: ignore[assignment]  # msgspec takes a union of Struct types
        decoder = _publication_decoders[channel] = msgspec.msgpack.Decoder(union)
    return decoder


def decode(channel: Channel, binder: bool, frames: list[bytes], peer_ip: bytes = b"", peer_key: str = "") -> Inbound:
    """The message ``frames`` carry on ``channel``, as its binder (``binder``) or a peer takes it."""
    if channel.pattern == PUBLISH:
        assert not binder and len(frames) == 2, (channel.name, len(frames))
        return Inbound(channel, _checked(channel, _decoded(channel, _publication_decoder(channel), frames[1]),
                                         asking=False))
    if not channel.framed:  # the client protocol
        if not binder:
            return Inbound(channel, CLIENT_FRAME, frames[-1])
        if len(frames) == 2:
            flag = INTERNAL if channel is FRONT_INTERNAL else DIRECT if frames[0][:1] > b"\0" else PLAIN
            return Inbound(channel, CLIENT_FRAME, frames[1], Origin(channel, frames[0], flag=flag), peer_ip,
                           peer_key)
        if len(frames) == 3 and not frames[1]:
            return Inbound(channel, CLIENT_FRAME, frames[2], Origin(channel, frames[0], flag=REQ), peer_ip,
                           peer_key)
        raise WireError(f"{len(frames)} frames where the client protocol has one (or a delimiter and one)")
    if binder:
        assert len(frames) == 3, (channel.name, len(frames))
        routed = _decoded(channel, routed_decoder, frames[1])
        origin = Origin(channel, frames[0], routed.client, routed.flag)
        return Inbound(channel, _checked(channel, routed.order, asking=True), frames[2], origin)
    assert len(frames) == 2, (channel.name, len(frames))
    answered = _decoded(channel, answered_decoder, frames[0])
    _checked(channel, answered.note, asking=False)
    return Inbound(channel, answered, frames[1])


def _decoded(channel: Channel, decoder: msgspec.msgpack.Decoder[Any], frame: bytes) -> Any:
    """Between actors, a frame that does not decode is a message the channel does not declare."""
    try:
        return decoder.decode(frame)
    except msgspec.ValidationError as exc:
        raise AssertionError(f"a message not declared on {channel.name!r}: {exc}") from None


def _checked(channel: Channel, body: object, *, asking: bool) -> object:
    assert channel.allows(body, asking=asking), f"{type(body).__name__} is not declared on {channel.name!r}"
    return body


def reply_frames(origin: Origin, payload: bytes, note: object = None) -> list[bytes]:
    """The answer to a request from ``origin``, for its channel's binder to send."""
    channel = origin.channel
    if channel.framed:
        _checked(channel, note, asking=False)
        return [origin.peer, encoder.encode(Answered(origin.client, origin.flag, note)), payload]  # type: ignore[arg-type]
    assert note is None
    return [origin.peer, b"", payload] if origin.flag == REQ else [origin.peer, payload]


def direct_frames(origin: Origin, payload: bytes, note: object = None) -> list[bytes] | None:
    """The answer to a request from ``origin`` as the actor that made it sends it straight to the
    client, on its own ROUTER (``engine/ipc/direct_replies.py``); None when it must go through the
    front: a note is for the front, and only a client that chose its routing id (``DIRECT``) may be
    answered past it. Whether that client is connected there is its socket's to say (the runtime's
    ROUTER_MANDATORY, the simulation's network): when it is not, the answer goes through the front."""
    if origin.flag != DIRECT or note is not None or not origin.channel.framed:
        return None
    return [origin.client, payload]


def request_frames(channel: Channel, routed: Routed | None, payload: bytes) -> list[bytes]:
    """A request on ``channel`` from one of its peers: ``routed`` (None on a client channel) and the client frame."""
    if channel.framed:
        assert routed is not None
        _checked(channel, routed.order, asking=True)
        return [encoder.encode(routed), payload]
    assert routed is None
    return [payload]


def publication_frames(channel: Channel, topic: bytes, body: msgspec.Struct | bytes) -> list[bytes]:
    """A publication on ``channel``; ``body`` may come encoded already (a hot path's own encoding)."""
    if isinstance(body, bytes):
        return [topic, body]
    _checked(channel, body, asking=False)
    return [topic, encoder.encode(body)]
