"""The front's figures: what it counts of the requests it serves, and the ``status`` reply.

Counts start at 0 with the process: the requests taken from clients and the internal port
(the heartbeat's ``requests``), the requests routed by op (``rmqpy_requests``; a request
held for the topic table's save counts once more when it is routed again), and the
refusals the front gave for an actor behind it (``rmqpy_refusals``: BUSY from a full queue
to the writer, SERVICE_NOT_AVAILABLE for an actor that is down, DISK_FULL when the topic
table cannot be saved).

Called by the front (``engine/actors/front.py``) as it takes, routes and refuses requests,
and for its heartbeat, metrics and ``status``.
"""

from __future__ import annotations

from engine.errors import ErrorCode
from engine.ipc.protocol import encode_reply
from engine.store.shared_offsets import SharedOffsets


class FrontFigures:
    """Counters since this process started."""

    def __init__(self) -> None:
        self.requests_served = 0
        self.requests_by_op: dict[str, int] = {}
        self.refusals: dict[str, int] = {}

    def routed(self, op: str) -> None:
        self.requests_by_op[op] = self.requests_by_op.get(op, 0) + 1

    def refused(self, code: ErrorCode) -> None:
        self.refusals[code.name] = self.refusals.get(code.name, 0) + 1

    @staticmethod
    def status(request_id: int, offsets: SharedOffsets, *, owner_count: int, topic_count: int,
               flush_mode: str) -> bytes:
        """The ``status`` reply: the shared offsets, the number of topics, the flush mode."""
        return encode_reply(request_id, offsets=offsets.snapshot(owner_count), topics=topic_count,
                            flush_mode=flush_mode)

    def rows(self) -> dict[str, list[list[str | int]]]:
        """``rmqpy_requests`` and the front's ``rmqpy_refusals``."""
        return {"rmqpy_requests": [[op, count] for op, count in self.requests_by_op.items()],
                "rmqpy_refusals": [[code, "front", count] for code, count in self.refusals.items()]}
