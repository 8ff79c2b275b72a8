"""The pure parts of the operators' overview and of a stored traceback: percentiles, the
limits shown, a traceback cut to its bound."""

from __future__ import annotations

from conveyor.engine import failure
from conveyor.engine.limits import KeyUsage
from conveyor.ui import operators


def test_percentiles_are_nearest_rank_and_none_without_values() -> None:
    values = [float(n) for n in range(1, 101)]
    assert operators.percentile(values, 0.5) == 50.0
    assert operators.percentile(values, 0.95) == 95.0
    assert operators.percentile([3.0], 0.95) == 3.0
    assert operators.percentile([], 0.5) is None


def test_only_limits_in_use_or_with_jobs_waiting_are_shown() -> None:
    tenant = "6f1c0c5e-0000-0000-0000-000000000001"
    permits = [
        KeyUsage(key=f"tenant:{tenant}", in_use=2, limit=5, waiting=0),
        KeyUsage(key=f"tenant:{tenant}x", in_use=0, limit=5, waiting=0),
    ]
    shown = operators.limits_json(permits, {tenant: "acme"})
    assert [(row["scope"], row["in_use"], row["waiting"]) for row in shown] == [("tenant", 2, 0)]


def test_a_long_traceback_is_cut_in_the_middle_keeping_where_it_began_and_ended() -> None:
    try:
        raise ValueError("x" * 20_000 + " the end")
    except ValueError as error:
        text = failure.traceback_of(error)
    assert text is not None and len(text) <= failure.TRACEBACK_CHARS + 100
    assert text.startswith("Traceback (most recent call last):")
    assert "characters cut" in text
    assert text.rstrip().endswith("x the end")
