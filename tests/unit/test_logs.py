"""A flood of one event (a stale message dropped, by the thousand after a broker outage) is
logged in full once a spell, with how many were only counted."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import billiard.util
import pytest

from conveyor import logs
from conveyor.logs import Flood
from tests.support.logging_state import kept_logging


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


@pytest.fixture
def configured() -> Iterator[None]:
    with kept_logging():
        yield


def test_the_worker_pool_s_records_are_json_though_its_logger_does_not_propagate(
    configured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("json", logging.INFO)

    pool = billiard.util.get_logger()  # what Celery's prefork pool logs a dead process with
    pool.error("Process %r pid:%r exited with %r", "ForkPoolWorker-1", 42, "signal 9 (SIGKILL)")

    [line] = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["logger"] == "multiprocessing" and record["level"] == "error"
    assert "exited with 'signal 9 (SIGKILL)'" in record["event"]
