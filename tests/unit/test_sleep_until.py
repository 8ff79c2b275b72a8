"""A delay that sleeps until a time (``until``, from a template, in a ``timezone``) rather
than for ``seconds``: its job is held until that moment; a bad time or zone is refused at
apply when written literally, and fails the node (not retried) naming the fix when a
template renders one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conveyor.engine import planning, ready
from conveyor.engine.definitions import Node, Workflow
from conveyor.engine.validation import validate
from conveyor.exceptions import NonRetryableError

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def sleeper(**config: Any) -> Node:
    return Node(id="sleep", type="delay", config=config)


def problems(**config: Any) -> list[str]:
    return validate({"name": "wf", "nodes": [{"id": "s", "type": "delay", "config": config}]})


def test_a_delay_sleeps_until_the_time_its_template_gives_read_in_its_timezone() -> None:
    node = sleeper(until="{{ input.trial_ends }}", timezone="Europe/Paris")
    context = {"input": {"trial_ends": "2026-03-02T09:00"}, "nodes": {}}

    # 09:00 in Paris on 2 March is 08:00 UTC (winter time): 20 hours after noon UTC
    assert planning.delay_seconds(node, context, NOW) == 20 * 3600


def test_a_time_with_its_own_offset_keeps_it_and_one_without_a_zone_is_utc() -> None:
    with_offset = sleeper(until="2026-03-01T15:00:00+02:00", timezone="Europe/Paris")
    utc = sleeper(until="2026-03-01T13:30")

    assert planning.delay_seconds(with_offset, {}, NOW) == 3600
    assert planning.delay_seconds(utc, {}, NOW) == 5400


def test_a_time_already_past_runs_at_once() -> None:
    assert planning.delay_seconds(sleeper(until="2026-02-01T00:00"), {}, NOW) == 0.0


def test_the_ready_job_is_held_until_that_moment() -> None:
    workflow = Workflow.model_validate(
        {"name": "wf", "nodes": [{"id": "sleep", "type": "delay",
                                  "config": {"until": "{{ input.at }}"}}]}
    )  # fmt: skip
    node = workflow.node("sleep")
    (job,) = ready.new_jobs(workflow, [(node, {"input": {"at": "2026-03-01T18:00Z"}})], NOW)

    assert job.next_run_at == datetime(2026, 3, 1, 18, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"until": "next tuesday"}, "not a time"),
        ({"until": "2026-03-02T09:00", "timezone": "Europe/Pariss"}, "not a timezone"),
        ({"until": "2026-03-02T09:00", "seconds": 5}, "exclusive"),
        ({"seconds": 5, "timezone": "UTC"}, "config.timezone reads config.until"),
    ],
)
def test_a_literal_bad_time_or_zone_is_refused_at_apply(config: dict[str, Any], words: str) -> None:
    found = problems(**config)
    assert any(words in p for p in found), found


def test_a_template_is_checked_when_it_renders() -> None:
    assert problems(until="{{ input.at }}", timezone="{{ input.zone }}") == []
    node = sleeper(until="{{ input.at }}", timezone="{{ input.zone }}")

    with pytest.raises(NonRetryableError, match="not a time; give an ISO 8601 time"):
        planning.delay_seconds(node, {"input": {"at": "soon", "zone": "UTC"}}, NOW)
    with pytest.raises(NonRetryableError, match=r'give an IANA name, e\.g\. "Europe/Paris"'):
        planning.delay_seconds(node, {"input": {"at": "2026-03-02", "zone": "Mars/Olympus"}}, NOW)


def test_a_time_further_than_the_longest_delay_is_refused() -> None:
    far = (NOW + timedelta(days=365 * 200)).isoformat()
    with pytest.raises(NonRetryableError, match="give a nearer time"):
        planning.delay_seconds(sleeper(until=far), {}, NOW)
