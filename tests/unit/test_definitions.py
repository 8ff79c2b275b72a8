"""A definition's digest changes exactly when the stored definition would."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.engine.definitions import Workflow
from conveyor.exceptions import Snooze


def definition(**node_b: Any) -> dict[str, Any]:
    return {
        "name": "wf",
        "nodes": [
            {"id": "a", "type": "python", "config": {"function": "f"}},
            {
                "id": "b",
                "type": "http",
                "needs": ["a"],
                "config": {"url": "https://example.com", "method": "POST"},
                "inputs": {"x": 1, "y": {"p": 1, "q": 2}},
                **node_b,
            },
        ],
    }


def reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(v) for v in value]
    return value


def digest(data: dict[str, Any]) -> str:
    return Workflow.model_validate(data).digest()


def test_digest_does_not_depend_on_key_order() -> None:
    data = definition()
    shuffled = reversed_keys(data)
    assert list(shuffled) != list(data)  # the orders really differ

    assert digest(shuffled) == digest(data)


def test_digest_is_the_same_when_a_default_is_written_out() -> None:
    assert digest(definition(timeout=None)) == digest(definition())


def test_digest_changes_when_a_node_config_changes() -> None:
    changed = definition(config={"url": "https://example.com/v2", "method": "POST"})

    assert digest(changed) != digest(definition())


def test_digest_changes_when_a_node_input_changes() -> None:
    changed = definition(inputs={"x": 2, "y": {"p": 1, "q": 2}})

    assert digest(changed) != digest(definition())


def test_digest_changes_when_a_node_policy_changes() -> None:
    assert digest(definition(retry={"max_attempts": 5})) != digest(definition())


def test_max_snoozes_is_stored_when_set_and_absent_when_not_so_old_digests_hold() -> None:
    plain = Workflow.model_validate(definition())
    assert "max_snoozes" not in plain.canonical_json()
    assert plain.nodes[1].snooze_bound == 100
    bounded = Workflow.model_validate(definition(max_snoozes=3))
    assert '"max_snoozes":3' in bounded.canonical_json()
    assert bounded.digest() != plain.digest()
    assert Workflow.model_validate_json(bounded.canonical_json()).nodes[1].snooze_bound == 3


def test_a_snooze_outside_its_bounds_is_refused_naming_them() -> None:
    with pytest.raises(ValueError, match=r"from 0.001 s to a day \(86400 s\), not -1.0 s"):
        Snooze(-1)
    assert str(Snooze(30, "ledger not synced")) == "snoozed for 30s: ledger not synced"
