"""The metrics' shape (conveyor.metrics.metric_families): what a snapshot shows, pure."""

from __future__ import annotations

import platform
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from conveyor.engine.limits import KeyUsage
from conveyor.engine.states import ExecutionStatus, JobStatus
from conveyor.metrics import BOUNDS, Histogram, Snapshot, metric_families

EMPTY = Histogram(buckets=[0] * len(BOUNDS), total=0.0, count=0)


def shown(
    workflow_label: bool = True, **fields: Any
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    base = {"taken_at": datetime.now(UTC), "queue_depth": None, "jobs": {}, "executions": {},
            "attempts": {}, "wait": EMPTY, "run": EMPTY}  # fmt: skip
    snap = Snapshot(**{**base, **fields})
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metric_families(snap, workflow_label=workflow_label)
        for s in family.samples
    }


def test_every_status_is_shown_and_zero_when_no_row_has_it() -> None:
    found = shown(jobs={("node", "completed"): 3}, executions={"running": 1})

    for status in JobStatus:
        for kind in ("execution", "node"):
            expected = 3 if (kind, status) == ("node", "completed") else 0
            assert found[("conveyor_jobs", (("kind", kind), ("status", status.value)))] == expected
    for execution in ExecutionStatus:
        expected = 1 if execution is ExecutionStatus.RUNNING else 0
        assert found[("conveyor_executions", (("status", execution.value),))] == expected
    for tries in ("running", "succeeded", "failed"):
        assert found[("conveyor_attempts_total", (("status", tries),))] == 0


def test_the_build_info_names_the_versions_of_conveyor_and_python() -> None:
    labels = (("python", platform.python_version()), ("version", metadata.version("conveyor")))
    assert shown()[("conveyor_build_info", labels)] == 1


def test_the_limits_keys_name_tenants_by_name_as_conveyor_limits_does() -> None:
    tenant = "0193c5a2-0000-7000-8000-000000000001"
    permits = [
        KeyUsage(key="global", in_use=1, limit=100, waiting=0),
        KeyUsage(key=f"tenant:{tenant}", in_use=1, limit=10, waiting=2),
        KeyUsage(key=f"workflow:{tenant}:orders", in_use=1, limit=5, waiting=2),
        KeyUsage(key="tenant:0193c5a2-0000-7000-8000-00000000000f", in_use=0, limit=10, waiting=0),
    ]

    found = shown(permits=permits, tenant_names={tenant: "acme"})

    assert found[("conveyor_permits_in_use", (("name", ""), ("scope", "global")))] == 1
    assert found[("conveyor_permits_waiting", (("name", "acme"), ("scope", "tenant")))] == 2
    assert found[("conveyor_permits_limit", (("name", "acme/orders"), ("scope", "workflow")))] == 5
    # a tenant deleted since (or not read) stands for itself
    gone = (("name", "0193c5a2-0000-7000-8000-00000000000f"), ("scope", "tenant"))
    assert found[("conveyor_permits_limit", gone)] == 10


def hist(count: int, total: float) -> Histogram:
    return Histogram(buckets=[count] * len(BOUNDS), total=total, count=count)


def test_only_the_queues_whose_jobs_make_tries_show_an_empty_wait() -> None:
    found = shown()

    waits = {labels for (name, labels), _ in found.items()
             if name == "conveyor_job_wait_seconds_count"}  # fmt: skip
    # workflow-scheduled and workflow-webhook jobs never make a try: no series forever empty
    assert waits == {(("queue", "workflow-execution"),), (("queue", "workflow-node"),)}


def test_the_run_histogram_by_queue_alone_without_the_workflow_label() -> None:
    run_by = {("workflow-node", "orders"): hist(3, 1.5), ("workflow-node", "billing"): hist(2, 1.0),
              ("workflow-execution", ""): hist(1, 0.25)}  # fmt: skip

    labelled = shown(run_by=run_by)
    alone = shown(workflow_label=False, run_by=run_by)

    node = ("queue", "workflow-node")
    assert labelled[("conveyor_job_run_seconds_count", (node, ("workflow", "orders")))] == 3
    runs = {labels: v for (name, labels), v in alone.items()
            if name.startswith("conveyor_job_run_seconds")}  # fmt: skip
    assert not any(label == "workflow" for labels in runs for label, _ in labels)
    assert alone[("conveyor_job_run_seconds_count", (node,))] == 5
    assert alone[("conveyor_job_run_seconds_sum", (node,))] == 2.5
    assert alone[("conveyor_job_run_seconds_bucket", (("le", "0.5"), node))] == 5
    assert alone[("conveyor_job_run_seconds_count", (("queue", "workflow-execution"),))] == 1
