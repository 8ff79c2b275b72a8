"""A flood of one event (a stale message dropped, by the thousand after a broker outage) is
logged in full once a spell, with how many were only counted."""

from __future__ import annotations

from conveyor.logs import Flood


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_event_is_logged_in_full_and_the_rest_of_its_spell_only_counted() -> None:
    clock = Clock()
    flood = Flood(every=10.0, clock=clock)

    first = flood.admit()
    rest = [flood.admit() for _ in range(500)]

    assert first == 0
    assert rest == [None] * 500


def test_the_first_event_of_the_next_spell_says_how_many_were_only_counted() -> None:
    clock = Clock()
    flood = Flood(every=10.0, clock=clock)
    flood.admit()
    for _ in range(41):
        flood.admit()

    clock.now += 10.0
    next_spell = flood.admit()
    clock.now += 9.9
    within = flood.admit()

    assert next_spell == 41
    assert within is None
