"""The helper the limit tests measure concurrency with must itself be right."""

from __future__ import annotations

from tests.support.services import max_overlap


def test_nested_and_chained_intervals_are_counted_by_their_peak() -> None:
    assert max_overlap([]) == 0
    assert max_overlap([(0, 10), (1, 2), (1.5, 3)]) == 3
    assert max_overlap([(0, 1), (1, 2), (2, 3)]) == 1  # a hand-over is not an overlap
    assert max_overlap([(0, 5), (4, 6), (5, 7)]) == 2
