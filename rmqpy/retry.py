"""When to retry a refused request, and how long to wait first.

The engine answers ``BUSY`` when its writer is overloaded, ``SERVICE_NOT_AVAILABLE``
while the process that serves a request restarts (docs/protocol.md 7.3, 8.4),
``SLAVE_NOT_AVAILABLE`` while too few replicas are in sync, and ``NOT_MASTER`` from an engine
that is not (or no longer) its broker set's master (docs/replication.md). These
refusals mean that nothing was done, so sending the same request again is safe, after a
pause that grows with each refusal so that a crowd of clients does not keep the engine
overloaded. Every other refusal is final: retrying an invalid message or a missing topic
only fails again.

A timeout is never retried: a send whose reply was lost may have stored its messages,
and sending it again would store them twice (docs/protocol.md 4.1, "Retries").

``RetryPolicy.backoff_ms`` and ``RetryPolicy.should_retry`` are pure; ``call_with_retry``
and ``call_with_retry_async`` are the loops that apply them.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec

from engine.client import EngineError
from engine.errors import ErrorCode

__all__ = ["RETRIABLE_CODES", "OnRetry", "RetryPolicy", "call_with_retry", "call_with_retry_async"]

T = TypeVar("T")

RETRIABLE_CODES: frozenset[int] = frozenset({ErrorCode.BUSY, ErrorCode.SERVICE_NOT_AVAILABLE,
                                              ErrorCode.SLAVE_NOT_AVAILABLE, ErrorCode.NOT_MASTER})
"""The refusals after which the engine has done nothing and may do it if asked again later."""

OnRetry = Callable[[EngineError, int, float], None]
"""Called before each retry with the refusal, the retry's number (1 for the first) and the pause in ms."""


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Bounded exponential backoff with equal jitter.

    Retry ``n`` (1 for the first) waits a random time between half and all of
    ``min(backoff_ms_max, backoff_ms_min * backoff_multiplier ** (n - 1))``: the random half
    spreads clients that were refused together, the fixed half keeps the pause growing.
    """

    retry_count_max: int = 5
    """Retries after the first attempt; 0 never retries."""
    backoff_ms_min: float = 20.0
    """The ceiling of the first retry's pause."""
    backoff_ms_max: float = 2_000.0
    """No pause is longer than this."""
    backoff_multiplier: float = 2.0
    """How much the ceiling grows from one retry to the next."""
    retriable_codes: frozenset[int] = RETRIABLE_CODES
    """The error codes that are retried; any other refusal is raised at once."""

    def __post_init__(self) -> None:
        if self.retry_count_max < 0:
            raise ValueError(f"retry_count_max must be >= 0, not {self.retry_count_max}")
        if not 0 < self.backoff_ms_min <= self.backoff_ms_max:
            raise ValueError("need 0 < backoff_ms_min <= backoff_ms_max")
        if self.backoff_multiplier < 1:
            raise ValueError(f"backoff_multiplier must be >= 1, not {self.backoff_multiplier}")

    @classmethod
    def never(cls) -> RetryPolicy:
        """Raise every refusal at once."""
        return cls(retry_count_max=0)

    def backoff_ms(self, retry: int, *, jitter: float) -> float:
        """The pause before retry number ``retry`` (1 for the first); ``jitter`` is in [0, 1]."""
        assert retry >= 1, retry
        assert 0.0 <= jitter <= 1.0, jitter
        exponent = min(retry - 1, 64)  # past 2 ** 64 every ceiling is backoff_ms_max anyway
        ceiling = min(self.backoff_ms_max, self.backoff_ms_min * self.backoff_multiplier ** exponent)
        return ceiling / 2 + ceiling / 2 * jitter

    def should_retry(self, error: BaseException, retry: int) -> bool:
        """Whether a request refused with ``error`` gets retry number ``retry``."""
        return isinstance(error, EngineError) and error.code in self.retriable_codes and retry <= self.retry_count_max


def call_with_retry(policy: RetryPolicy, call: Callable[[], T], *, on_retry: OnRetry | None = None) -> T:
    """``call()``, again after each refusal the policy retries; the last refusal is raised."""
    retry = 0
    while True:
        try:
            return call()
        except EngineError as error:
            retry += 1
            if not policy.should_retry(error, retry):
                raise
            pause_ms = policy.backoff_ms(retry, jitter=random.random())
            if on_retry is not None:
                on_retry(error, retry, pause_ms)
            time.sleep(pause_ms / 1000)  # a pause the engine asked for, not a wait for some state


async def call_with_retry_async(policy: RetryPolicy, call: Callable[[], Awaitable[T]], *,
                                on_retry: OnRetry | None = None) -> T:
    """The asyncio twin of ``call_with_retry``: ``call()`` makes a new awaitable for each attempt."""
    retry = 0
    while True:
        try:
            return await call()
        except EngineError as error:
            retry += 1
            if not policy.should_retry(error, retry):
                raise
            pause_ms = policy.backoff_ms(retry, jitter=random.random())
            if on_retry is not None:
                on_retry(error, retry, pause_ms)
            await asyncio.sleep(pause_ms / 1000)
