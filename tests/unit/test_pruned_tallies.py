"""The pruned tallies read at the histogram's bounds, whatever bounds they were tallied at."""

from __future__ import annotations

from conveyor.store.stats import at_or_under, tally_name


def test_a_bucket_counts_the_values_tallied_at_its_bound() -> None:
    tallies = {
        tally_name("waited"): (7, 1.5),
        tally_name("waited", 0.01): (3, 0.0),
        tally_name("waited", 0.1): (6, 0.0),
        tally_name("duration", 0.01): (100, 0.0),
    }
    assert at_or_under(tallies, "waited", 0.01) == 3
    assert at_or_under(tallies, "waited", 0.1) == 6
    assert at_or_under(tallies, "duration", 0.01) == 100  # each column its own


def test_values_tallied_at_other_bounds_count_under_the_next_bound_up_never_over() -> None:
    # tallied by a version whose bounds were 0.02 and 0.2
    tallies = {tally_name("waited", 0.02): (4, 0.0), tally_name("waited", 0.2): (9, 0.0)}
    assert at_or_under(tallies, "waited", 0.01) == 0  # some may be under 0.01: not known
    assert at_or_under(tallies, "waited", 0.025) == 4
    assert at_or_under(tallies, "waited", 0.1) == 4
    assert at_or_under(tallies, "waited", 300.0) == 9


def test_nothing_tallied_counts_nothing() -> None:
    assert at_or_under({}, "waited", 1.0) == 0
    assert at_or_under({"attempts:failed": (2, 0.0)}, "waited", 1.0) == 0
