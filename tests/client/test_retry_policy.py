"""The retry policy alone: which refusals are retried, how long the pauses are, when it gives up."""

from __future__ import annotations

import asyncio

import pytest

from engine.client import EngineError, RequestTimeout
from engine.errors import ErrorCode
from rmqpy.retry import RetryPolicy, call_with_retry, call_with_retry_async

pytestmark = pytest.mark.timeout(10)


def refusal(code: ErrorCode) -> EngineError:
    return EngineError(code, code.name, "refused")


def test_the_pause_grows_by_the_multiplier_up_to_the_ceiling_and_jitter_keeps_at_least_half() -> None:
    policy = RetryPolicy(backoff_ms_min=10, backoff_ms_max=100, backoff_multiplier=2)
    ceilings = [policy.backoff_ms(retry, jitter=1.0) for retry in range(1, 8)]
    assert ceilings == [10, 20, 40, 80, 100, 100, 100]
    assert [policy.backoff_ms(retry, jitter=0.0) for retry in range(1, 5)] == [5, 10, 20, 40]
    assert policy.backoff_ms(10_000, jitter=0.5) == 75, "a huge retry number neither overflows nor passes the ceiling"


def test_only_refusals_that_stored_nothing_are_retried_and_only_up_to_the_count() -> None:
    policy = RetryPolicy(retry_count_max=2)
    assert policy.should_retry(refusal(ErrorCode.BUSY), 1)
    assert policy.should_retry(refusal(ErrorCode.SERVICE_NOT_AVAILABLE), 2)
    assert policy.should_retry(refusal(ErrorCode.SLAVE_NOT_AVAILABLE), 2)
    assert not policy.should_retry(refusal(ErrorCode.BUSY), 3), "past retry_count_max"
    for code in (ErrorCode.MESSAGE_ILLEGAL, ErrorCode.FLUSH_FAILED, ErrorCode.TIMEOUT, ErrorCode.INVALID_FIELD):
        assert not policy.should_retry(refusal(code), 1), code
    assert not policy.should_retry(RequestTimeout("lost"), 1), "a send that timed out may have been stored"
    assert not RetryPolicy.never().should_retry(refusal(ErrorCode.BUSY), 1)


def test_a_policy_with_impossible_numbers_is_refused() -> None:
    for make in (lambda: RetryPolicy(retry_count_max=-1), lambda: RetryPolicy(backoff_ms_min=0),
                 lambda: RetryPolicy(backoff_ms_min=10, backoff_ms_max=5), lambda: RetryPolicy(backoff_multiplier=0.5)):
        with pytest.raises(ValueError):
            make()


def test_call_with_retry_retries_busy_then_returns_and_raises_a_final_refusal_at_once() -> None:
    policy = RetryPolicy(retry_count_max=3, backoff_ms_min=1, backoff_ms_max=2)
    answers: list[EngineError | str] = [refusal(ErrorCode.BUSY), refusal(ErrorCode.BUSY), "stored"]
    seen: list[tuple[int, int]] = []

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, EngineError):
            raise answer
        return answer

    assert call_with_retry(policy, call, on_retry=lambda e, n, pause: seen.append((e.code, n))) == "stored"
    assert seen == [(ErrorCode.BUSY, 1), (ErrorCode.BUSY, 2)]

    calls = 0

    def illegal() -> str:
        nonlocal calls
        calls += 1
        raise refusal(ErrorCode.MESSAGE_ILLEGAL)

    with pytest.raises(EngineError) as info:
        call_with_retry(policy, illegal)
    assert (info.value.code, calls) == (ErrorCode.MESSAGE_ILLEGAL, 1)


def test_the_async_loop_gives_up_after_retry_count_max_with_the_last_refusal() -> None:
    policy = RetryPolicy(retry_count_max=2, backoff_ms_min=1, backoff_ms_max=2)
    calls = 0

    async def busy() -> None:
        nonlocal calls
        calls += 1
        raise refusal(ErrorCode.BUSY)

    with pytest.raises(EngineError) as info:
        asyncio.run(call_with_retry_async(policy, busy))
    assert (info.value.code, calls) == (ErrorCode.BUSY, 3)
