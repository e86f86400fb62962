"""Statuses and error codes, each with a stable number that clients may rely on.

Three families, as in RocketMQ:

* ``PutStatus``: the outcome of storing one message (S/PutMessageStatus.java);
* ``GetStatus``: the outcome of a pull (S/GetMessageStatus.java);
* ``ErrorCode``: a request the engine refused before doing anything.

The numbers never change meaning; new members get new numbers.
"""

from __future__ import annotations

import enum


class PutStatus(enum.IntEnum):
    PUT_OK = 0
    FLUSH_DISK_TIMEOUT = 1
    FLUSH_SLAVE_TIMEOUT = 2
    SLAVE_NOT_AVAILABLE = 3
    SERVICE_NOT_AVAILABLE = 4
    CREATE_MAPPED_FILE_FAILED = 5
    MESSAGE_ILLEGAL = 6
    PROPERTIES_SIZE_EXCEEDED = 7
    OS_PAGE_CACHE_BUSY = 8
    UNKNOWN_ERROR = 9
    DISK_FULL = 10


class GetStatus(enum.IntEnum):
    FOUND = 0
    NO_MATCHED_MESSAGE = 1
    MESSAGE_WAS_REMOVING = 2
    OFFSET_FOUND_NULL = 3
    OFFSET_OVERFLOW_BADLY = 4
    OFFSET_OVERFLOW_ONE = 5
    OFFSET_TOO_SMALL = 6
    NO_MATCHED_LOGIC_QUEUE = 7
    NO_MESSAGE_IN_QUEUE = 8
    OFFSET_RESET = 9


class ErrorCode(enum.IntEnum):
    """Why a request was refused. 0 is never an error."""

    MALFORMED_REQUEST = 1  # not msgpack, not a map, or invalid UTF-8
    UNSUPPORTED_VERSION = 2
    UNKNOWN_OP = 3
    INVALID_FIELD = 4  # a field is missing, of the wrong type or out of range
    INVALID_TOPIC = 5
    TOPIC_NOT_FOUND = 6
    QUEUE_NOT_FOUND = 7
    MESSAGE_ILLEGAL = 8  # body empty or over message_body_bytes_max, batch too large
    PROPERTIES_SIZE_EXCEEDED = 9
    INVALID_PROPERTY = 10  # separator characters in a property, key or tag
    INVALID_MSG_ID = 11
    MESSAGE_NOT_FOUND = 12
    MESSAGE_CORRUPT = 13  # the record failed its CRC check; it is never served
    SERVICE_NOT_AVAILABLE = 14
    TIMEOUT = 15
    TOPIC_EXISTS = 16
    INTERNAL_ERROR = 17
    DISK_FULL = 18  # the store's disk has no room for a new file; nothing was stored
    FLUSH_FAILED = 19  # the disk refused a flush; the writer restarts and recovers
    BUSY = 20  # the writer is overloaded: the send waited too long in its queue and was not stored
    LIMIT_EXCEEDED = 21  # a count limit of the store (topics, consumer offsets) would be passed
    INVALID_RECEIPT_HANDLE = 22  # not a handle of this group and queue, or stale: redelivered or changed since
    GROUP_MODE_CONFLICT = 23  # a group that commits offsets cannot pop, and a pop group cannot commit offsets
    DELAY_ILLEGAL = 24  # a deliver time further than timer_max_delay_ms (levels past the last are capped)
    TRANSACTION_NOT_FOUND = 25  # the id is not a half message of this store (or of this producer group)
    TRANSACTION_ENDED = 26  # the half message was already decided the other way (or rolled back by the checks)
    NOT_MASTER = 27  # this engine is a replica: it serves reads; writes go to its master
    SLAVE_NOT_AVAILABLE = 28  # SYNC replication with fewer than min_in_sync_replicas in sync: nothing was stored
    UNAUTHENTICATED = 29  # acl_enabled: the client is no user of the ACL (its CURVE key, or signature); nothing done
    FORBIDDEN = 30  # acl_enabled: the user's policies do not allow this action on this resource; nothing done
    ROUTE_VIA_FRONT = 31  # a send made straight to the writer that the front must route: nothing stored


class RequestError(Exception):
    """A request the engine refuses: carries the stable code and a message."""

    def __init__(self, code: ErrorCode, message: str, **details: int | str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.details = details
