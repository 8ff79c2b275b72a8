"""A failed try is retried after an exponential, capped, jittered wait, or dead-lettered."""

from __future__ import annotations

import random
from typing import Any

import pytest

from conveyor.engine.definitions import RetryPolicy
from conveyor.engine.retry import backoff, decide_failure


def policy(**fields: Any) -> RetryPolicy:
    return RetryPolicy(**{"jitter": 0.0, **fields})


def test_backoff_doubles_after_each_failed_try_without_jitter() -> None:
    p = policy(backoff=1.0, factor=2.0)

    assert [backoff(p, attempt) for attempt in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]


def test_backoff_uses_the_policy_factor_and_base() -> None:
    p = policy(backoff=0.5, factor=3.0)

    assert [backoff(p, attempt) for attempt in (1, 2, 3)] == [0.5, 1.5, 4.5]


def test_backoff_is_capped_by_max_backoff() -> None:
    p = policy(backoff=1.0, factor=2.0, max_backoff=5.0)

    assert [backoff(p, attempt) for attempt in (3, 4, 10, 60)] == [4.0, 5.0, 5.0, 5.0]


def test_jittered_backoff_stays_within_jitter_of_the_base() -> None:
    p = policy(backoff=1.0, factor=2.0, jitter=0.25)
    rng = random.Random(1234)
    base = 8.0  # attempt 4

    samples = [backoff(p, 4, rng) for _ in range(2000)]

    assert all(base * 0.75 <= s <= base * 1.25 for s in samples)
    # The spread is used in both directions, not a constant offset.
    assert min(samples) < base * 0.8
    assert max(samples) > base * 1.2


def test_jitter_is_applied_after_the_cap() -> None:
    p = policy(backoff=1.0, factor=2.0, max_backoff=10.0, jitter=0.5)
    rng = random.Random(99)

    samples = [backoff(p, 30, rng) for _ in range(1000)]

    assert all(5.0 <= s <= 15.0 for s in samples)
    assert max(samples) > 14.0


def test_same_seed_gives_the_same_jittered_backoff() -> None:
    p = policy(jitter=0.5)

    assert backoff(p, 2, random.Random(7)) == backoff(p, 2, random.Random(7))


def test_failure_is_retried_with_the_backoff_until_max_attempts() -> None:
    p = policy(max_attempts=3, backoff=1.0, factor=2.0)

    decisions = [decide_failure(p, attempt=a, retryable=True) for a in (1, 2)]

    assert [d.retry_in for d in decisions] == [1.0, 2.0]
    assert not any(d.gives_up for d in decisions)
    assert decisions[0].reason == "attempt 1 of 3 failed"


def test_failure_of_the_last_attempt_gives_up() -> None:
    decision = decide_failure(policy(max_attempts=3), attempt=3, retryable=True)

    assert decision.gives_up
    assert decision.retry_in is None
    assert decision.reason == "all 3 attempt(s) failed"


def test_single_attempt_policy_gives_up_after_the_first_failure() -> None:
    assert decide_failure(policy(max_attempts=1), attempt=1, retryable=True).gives_up


@pytest.mark.parametrize("attempt", [1, 2])
def test_non_retryable_failure_gives_up_at_once(attempt: int) -> None:
    decision = decide_failure(policy(max_attempts=5), attempt=attempt, retryable=False)

    assert decision.gives_up
    assert "not retryable" in decision.reason


def test_retry_decision_uses_the_given_random_source_for_jitter() -> None:
    p = policy(max_attempts=5, backoff=10.0, jitter=0.5)

    first = decide_failure(p, attempt=1, retryable=True, rng=random.Random(3))
    again = decide_failure(p, attempt=1, retryable=True, rng=random.Random(3))

    assert first.retry_in == again.retry_in
    assert first.retry_in is not None
    assert first.retry_in != 10.0
    assert 5.0 <= first.retry_in <= 15.0
