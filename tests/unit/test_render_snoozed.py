"""The node list of ``conveyor executions show`` (and ``run --wait``): a node whose job waits
after a snooze shows as snoozed, one whose job waits after a failed try as retrying."""

from __future__ import annotations

from typing import Any

from conveyor.cli.render import _node_status


def _views(status: str, attempts: list[str]) -> tuple[Any, Any]:
    node = {"id": "post", "status": "queued"}
    job = {"node": "post", "status": status, "attempts": [{"status": s} for s in attempts]}
    return node, job


def test_a_node_waiting_after_a_snooze_shows_snoozed_after_a_failure_retrying() -> None:
    assert _node_status(*_views("retry_wait", ["failed", "snoozed"])) == "snoozed"
    assert _node_status(*_views("retry_wait", ["snoozed", "failed"])) == "retrying"
    assert _node_status(*_views("queued", ["snoozed"])) == "queued"
