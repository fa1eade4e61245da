"""The SDK's retry policy: busy refusals are retried after the time the server gave, nothing else is."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.common.redis_client import outage_retry
from services.sdk.errors import InvalidRequestError, OverloadedError, UnavailableError
from services.sdk.retry import NO_RETRY, RetryPolicy


async def _run(policy: RetryPolicy, failures: list[Exception]) -> int:
    calls = 0
    async for attempt in policy.retrying():
        with attempt:
            calls += 1
            if failures:
                raise failures.pop(0)
    return calls


def test_overloaded_is_retried_until_admitted() -> None:
    busy = [OverloadedError("RESOURCE_EXHAUSTED", "full", 0.01) for _ in range(2)]
    assert asyncio.run(_run(RetryPolicy(budget_s=5), busy)) == 3


def test_a_malformed_request_is_not_retried() -> None:
    with pytest.raises(InvalidRequestError):
        asyncio.run(_run(RetryPolicy(), [InvalidRequestError("INVALID_ARGUMENT", "bad")]))


def test_the_budget_ends_a_pool_that_stays_full() -> None:
    busy = [OverloadedError("RESOURCE_EXHAUSTED", "full", 0.05) for _ in range(100)]
    with pytest.raises(OverloadedError):
        asyncio.run(_run(RetryPolicy(budget_s=0.2), busy))


def test_a_far_off_retry_after_is_capped() -> None:
    policy = RetryPolicy(max_wait_s=0.01, budget_s=5)
    assert asyncio.run(_run(policy, [OverloadedError("RESOURCE_EXHAUSTED", "full", 3600.0)])) == 2


def test_outage_retry_covers_its_budget_at_the_shortest_jitter() -> None:
    r = outage_retry(15.0)
    # Shortest possible total: every wait at half its nominal value (redis-py counts failures from 1).
    shortest = sum(min(1.0, 0.05 * 2**i) / 2 for i in range(1, r._retries + 1))
    assert 15.0 <= shortest < 20.0


def test_blocking_tries_retry_the_same_way_and_stop_after_a_success() -> None:
    policy = RetryPolicy(budget_s=5)
    failures: list[Exception] = [OverloadedError("RESOURCE_EXHAUSTED", "full", 0.01)]
    calls = 0
    for attempt in policy.retrying_sync():
        with attempt:
            calls += 1
            if failures:
                raise failures.pop(0)
    assert calls == 2


def test_no_retry_surfaces_the_first_busy_refusal() -> None:
    with pytest.raises(OverloadedError):
        asyncio.run(_run(NO_RETRY, [OverloadedError("RESOURCE_EXHAUSTED", "full", 0.01)]))


def test_the_last_wait_is_cut_to_the_budget() -> None:
    policy = RetryPolicy(budget_s=0.3, max_wait_s=10)
    busy = [OverloadedError("RESOURCE_EXHAUSTED", "full", 5.0) for _ in range(3)]
    t0 = time.monotonic()
    with pytest.raises(OverloadedError):
        asyncio.run(_run(policy, busy))
    assert time.monotonic() - t0 < 1.0  # one wait cut to what was left of 0.3 s, then the error


def test_waits_are_spread_so_refused_clients_do_not_return_together() -> None:
    busy = OverloadedError("RESOURCE_EXHAUSTED", "full", 2.0)
    waits = [RetryPolicy().wait_s(busy) for _ in range(200)]
    assert all(2.0 <= w <= 3.0 for w in waits)  # never before the Retry-After, at most half of it later
    assert max(waits) - min(waits) > 0.5
    assert RetryPolicy(jitter=0.0).wait_s(busy) == 2.0


def test_a_stream_that_breaks_after_running_longer_than_the_budget_is_still_retried() -> None:
    """NOTE(budget): a stage may rightly run for minutes; its break gets the whole budget to re-attach."""
    policy = RetryPolicy(budget_s=0.2, default_wait_s=0.01)

    async def go() -> int:
        calls = 0
        async for attempt in policy.retrying():
            with attempt:
                calls += 1
                if calls == 1:
                    await asyncio.sleep(0.3)  # streamed (or waited in the queue) past the budget
                    raise UnavailableError("UNAVAILABLE", "Stream removed")
        return calls

    assert asyncio.run(go()) == 2


def test_a_try_that_delivered_something_starts_the_budget_again() -> None:
    policy = RetryPolicy(budget_s=0.25, default_wait_s=0.1, backoff=1.0, jitter=0.0)

    async def go(progress: bool) -> int:
        calls = 0
        tries = policy.retrying()
        async for attempt in tries:
            with attempt:
                calls += 1
                if progress:
                    tries.progressed()  # as a stream does for each event
                if calls < 6:
                    raise UnavailableError("UNAVAILABLE", "Stream removed")
        return calls

    assert asyncio.run(go(progress=True)) == 6  # 0.5 s of waits, each after a try that made progress
    with pytest.raises(UnavailableError):
        asyncio.run(go(progress=False))  # the same failures with nothing delivered: the budget ends them
