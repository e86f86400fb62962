"""What the typed client raises: the raw client's exceptions, and the engine's stable codes.

Every exception is a ``ClientError``. Two kinds come from the engine and the network:

* ``EngineError``: the engine refused the request and did nothing (docs/protocol.md 3.2).
  Branch on ``error.code``, an ``ErrorCode`` number that never changes meaning; ``error.name``
  is its name. Codes this library does not know are still raised as ``EngineError``.
* ``RequestTimeout`` (also a ``TimeoutError``): no reply in time. The engine may or may not
  have done the request; a timed-out send may have stored its messages. ``ConnectionLost`` is
  one: the connection broke before the reply (a broker set's producer, whose master died).

``ClientClosed`` is raised by a call on a closed producer or consumer; ``NoMaster`` by a send on a
broker set's address that was not to wait for the set to elect its master (a cluster's producer
then sends to another set).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.client import ClientError, ConnectionLost, EngineError, RequestTimeout
from engine.errors import ErrorCode, GetStatus, PutStatus

__all__ = ["ClientClosed", "ClientError", "ConnectionLost", "EngineError", "ErrorCode", "GetStatus", "NoMaster",
           "PutStatus", "RequestTimeout", "engine_error", "is_refusal_of"]


class ClientClosed(ClientError):
    """The producer or consumer was closed; it cannot be used again."""


class NoMaster(ClientError):
    """The broker set has no master that answers right now (an election is under way), and the send
    was not to wait for one. ``cause``: the failure that sent the client looking."""

    def __init__(self, endpoints: list[str], cause: ClientError) -> None:
        super().__init__(f"no master answers among {', '.join(endpoints)} ({cause})")
        self.cause = cause


def engine_error(reply: Mapping[str, Any]) -> EngineError:
    """The ``EngineError`` an ``ok: false`` reply stands for, as ``StoreClient.request`` raises it."""
    error = reply.get("error") or {}
    details = {k: v for k, v in reply.items() if k not in ("v", "id", "ok", "error")}
    return EngineError(error.get("code", 0), error.get("name", "UNKNOWN"), error.get("message", ""), details)


def is_refusal_of(error: BaseException, *codes: ErrorCode) -> bool:
    """True when ``error`` is the engine refusing with one of ``codes``."""
    return isinstance(error, EngineError) and error.code in codes
