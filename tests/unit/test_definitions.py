"""A definition's digest changes exactly when the stored definition would."""

from __future__ import annotations

from typing import Any

from conveyor.engine.definitions import Workflow


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
