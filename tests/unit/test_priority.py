"""Priority defaults by source and overrides; how limits resolve."""

from __future__ import annotations

import pytest

from conveyor.engine import limits, priority
from conveyor.engine.states import Priority, TriggerSource


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (TriggerSource.API, Priority.HIGH),
        (TriggerSource.CLI, Priority.HIGH),
        (TriggerSource.WEBHOOK, Priority.HIGH),
        (TriggerSource.SCHEDULE, Priority.NORMAL),
        (TriggerSource.EVENT, Priority.NORMAL),
        (TriggerSource.BACKGROUND, Priority.LOW),
    ],
)
def test_each_source_has_its_default_priority(source: TriggerSource, expected: Priority) -> None:
    assert priority.choose(None, None, source) is expected


def test_the_callers_priority_beats_the_workflows_which_beats_the_sources() -> None:
    assert priority.choose(Priority.LOW, Priority.HIGH, TriggerSource.API) is Priority.LOW
    assert priority.choose(None, Priority.LOW, TriggerSource.API) is Priority.LOW


def test_tenant_and_workflow_overrides_replace_the_defaults() -> None:
    defaults = limits.Limits(global_=100, tenant=10, workflow=5)

    assert limits.resolve(defaults, tenant_override=None, workflow_override=None) == defaults
    assert limits.resolve(defaults, tenant_override=3, workflow_override=1) == limits.Limits(
        global_=100, tenant=3, workflow=1
    )
