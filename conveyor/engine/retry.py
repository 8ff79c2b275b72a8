"""What a failed try means: try again after a delay, or give up (dead-letter)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from conveyor.engine.definitions import RetryPolicy


@dataclass(frozen=True, kw_only=True)
class RetryDecision:
    """``retry_in`` seconds before the next try, or None to dead-letter the job now."""

    retry_in: float | None
    reason: str

    @property
    def gives_up(self) -> bool:
        return self.retry_in is None


def backoff(policy: RetryPolicy, attempt: int, rng: random.Random | None = None) -> float:
    """The wait after failed try number ``attempt`` (1-based): exponential, capped, jittered."""
    base = min(policy.backoff * policy.factor ** (attempt - 1), policy.max_backoff)
    if not policy.jitter:
        return base
    spread = base * policy.jitter
    return max(0.0, base + (rng or random).uniform(-spread, spread))


# How soon a try stopped by a cancel that was then undone runs again.
RESUME_AFTER_STOP = 0.001


def decide_stopped(attempt: int) -> RetryDecision:
    """A try stopped because its execution ended, which an operator has since undone (a dead
    letter requeued while it ran): not the node's failure, whatever its retry policy says. It
    runs again at once."""
    return RetryDecision(
        retry_in=RESUME_AFTER_STOP, reason=f"attempt {attempt} was stopped by an undone cancel"
    )


def decide_failure(
    policy: RetryPolicy, *, attempt: int, retryable: bool, rng: random.Random | None = None
) -> RetryDecision:
    """Decide what follows failed try number ``attempt`` (1-based)."""
    if not retryable:
        return RetryDecision(retry_in=None, reason="the error is not retryable")
    if attempt >= policy.max_attempts:
        return RetryDecision(retry_in=None, reason=f"all {policy.max_attempts} attempt(s) failed")
    delay = backoff(policy, attempt, rng)
    return RetryDecision(
        retry_in=delay, reason=f"attempt {attempt} of {policy.max_attempts} failed"
    )
