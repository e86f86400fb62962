"""The engine's error codes (``engine.errors``) as the RocketMQ 5 API's status codes
(``apache.rocketmq.v2.Code``), so that the official clients raise their own clear errors."""

from __future__ import annotations

from rocketmq.grpc_protocol import Code, Status

from engine.client import ClientError, EngineError, RequestTimeout
from engine.errors import ErrorCode, PutStatus

_BY_ERROR = {
    ErrorCode.MALFORMED_REQUEST: Code.BAD_REQUEST,
    ErrorCode.UNSUPPORTED_VERSION: Code.VERSION_UNSUPPORTED,
    ErrorCode.UNKNOWN_OP: Code.NOT_IMPLEMENTED,
    ErrorCode.INVALID_FIELD: Code.BAD_REQUEST,
    ErrorCode.INVALID_TOPIC: Code.ILLEGAL_TOPIC,
    ErrorCode.TOPIC_NOT_FOUND: Code.TOPIC_NOT_FOUND,
    ErrorCode.QUEUE_NOT_FOUND: Code.BAD_REQUEST,
    ErrorCode.MESSAGE_ILLEGAL: Code.MESSAGE_BODY_TOO_LARGE,
    ErrorCode.PROPERTIES_SIZE_EXCEEDED: Code.MESSAGE_PROPERTIES_TOO_LARGE,
    ErrorCode.INVALID_PROPERTY: Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
    ErrorCode.INVALID_MSG_ID: Code.ILLEGAL_MESSAGE_ID,
    ErrorCode.MESSAGE_NOT_FOUND: Code.MESSAGE_NOT_FOUND,
    ErrorCode.MESSAGE_CORRUPT: Code.MESSAGE_CORRUPTED,
    ErrorCode.SERVICE_NOT_AVAILABLE: Code.INTERNAL_SERVER_ERROR,
    ErrorCode.TIMEOUT: Code.PROXY_TIMEOUT,
    ErrorCode.TOPIC_EXISTS: Code.BAD_REQUEST,
    ErrorCode.INTERNAL_ERROR: Code.INTERNAL_ERROR,
    ErrorCode.DISK_FULL: Code.INTERNAL_SERVER_ERROR,
    ErrorCode.FLUSH_FAILED: Code.MASTER_PERSISTENCE_TIMEOUT,
    ErrorCode.BUSY: Code.TOO_MANY_REQUESTS,
    ErrorCode.LIMIT_EXCEEDED: Code.FORBIDDEN,
    ErrorCode.INVALID_RECEIPT_HANDLE: Code.INVALID_RECEIPT_HANDLE,
    ErrorCode.GROUP_MODE_CONFLICT: Code.PRECONDITION_FAILED,
    ErrorCode.DELAY_ILLEGAL: Code.ILLEGAL_DELIVERY_TIME,
    ErrorCode.TRANSACTION_NOT_FOUND: Code.INVALID_TRANSACTION_ID,
    ErrorCode.TRANSACTION_ENDED: Code.INVALID_TRANSACTION_ID,
    ErrorCode.NOT_MASTER: Code.FORBIDDEN,  # the endpoint of a replica: its writes go to its master
    ErrorCode.SLAVE_NOT_AVAILABLE: Code.SLAVE_PERSISTENCE_TIMEOUT,  # too few replicas in sync: nothing stored
    ErrorCode.UNAUTHENTICATED: Code.UNAUTHORIZED,
    ErrorCode.FORBIDDEN: Code.FORBIDDEN,
    ErrorCode.ROUTE_VIA_FRONT: Code.INTERNAL_SERVER_ERROR,  # never reaches the endpoint: its client sends again
}

# A send whose record was stored but not flushed or replicated in time: RocketMQ's proxy
# answers these with the persistence timeouts (the message may be there; a retry may duplicate).
_BY_PUT_STATUS = {
    PutStatus.PUT_OK: Code.OK,
    PutStatus.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    PutStatus.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
}


def status(code: int = Code.OK, message: str = "OK") -> Status:
    return Status(code=code, message=message)


def error_status(exc: ClientError) -> Status:
    """The status answering a request the engine refused or did not answer in time."""
    if isinstance(exc, RequestTimeout):
        return status(Code.PROXY_TIMEOUT, f"the engine did not answer in time: {exc}")
    assert isinstance(exc, EngineError)
    code = _BY_ERROR.get(exc.code, Code.INTERNAL_ERROR)  # type: ignore[call-overload]
    if exc.code == ErrorCode.MESSAGE_ILLEGAL and "empty" in exc.message:
        code = Code.MESSAGE_BODY_EMPTY
    return status(code, f"{exc.name}: {exc.message}")


_OK = status()


def put_status(put_code: int, name: str) -> Status:
    if put_code == PutStatus.PUT_OK:
        return _OK  # copied into each entry: never changed in place
    return status(_BY_PUT_STATUS.get(put_code, Code.INTERNAL_SERVER_ERROR), name)  # type: ignore[call-overload]
