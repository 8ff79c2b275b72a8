"""The metrics endpoint and `conveyor stats` against real services: Prometheus' own parser
reads it, and its numbers are the database's."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import timedelta
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select, text, update

from conveyor import metrics, wiring
from conveyor.api.app import create_app
from conveyor.config import Settings
from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution, Job, JobAttempt
from conveyor.service import Conveyor, utcnow
from conveyor.store import Database
from tests.integration.conftest import METRICS_TOKEN, SCRAPER, served
from tests.support.services import wait_for

CONVEYOR = [str(Path(sys.executable).parent / "conveyor")]


FLAKY = {
    "name": "flaky",
    "defaults": {"retry": {"max_attempts": 2, "backoff": 0.05}},
    "nodes": [{"id": "f", "type": "python", "inputs": {"failures": 1},
               "config": {"function": "test.flaky"}}],
}  # fmt: skip


def run_some(service: Conveyor) -> None:
    """Three good executions and one that dead-letters after two tries."""
    good = {
        "name": "good",
        "nodes": [
            {
                "id": "a",
                "type": "python",
                "inputs": {"a": 1, "b": 2},
                "config": {"function": "test.add"},
            }
        ],
    }
    bad = {"name": "bad", "defaults": {"retry": {"max_attempts": 2, "backoff": 0.05}},
           "nodes": [{"id": "f", "type": "python", "inputs": {"message": "boom"},
                      "config": {"function": "test.fail"}}]}  # fmt: skip
    service.apply(parse_workflow(good))
    service.apply(parse_workflow(bad))
    ids = [service.trigger("good") for _ in range(3)] + [service.trigger("bad")]
    assert [wait_for(service, i).status for i in ids] == [ExecutionStatus.COMPLETED] * 3 + [
        ExecutionStatus.FAILED
    ]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_metrics_parse_and_match_the_database(conveyor_service: Conveyor, api_url: str) -> None:
    run_some(conveyor_service)

    scraped = samples(httpx.get(f"{api_url}/metrics", headers=SCRAPER, timeout=30).text)

    with conveyor_service.db.transaction() as store:
        tries = store.session.scalar(select(func.count()).select_from(JobAttempt))
        failed = store.session.scalar(select(func.count()).where(JobAttempt.status == "failed"))
        node_jobs = store.session.scalar(select(func.count()).where(Job.kind == "node"))
        # the claim copied each try's job's queue and workflow version (the scrape groups by them)
        copied = store.session.execute(
            select(JobAttempt.queue, JobAttempt.workflow_id, Job.queue, Job.workflow_id).join(
                Job, Job.id == JobAttempt.job_id
            )
        ).all()
    assert len(copied) == tries and all(row[:2] == row[2:] for row in copied)
    assert scraped[("conveyor_dead_letters", ())] == 1
    assert scraped[("conveyor_executions", (("status", "completed"),))] == 3
    assert scraped[("conveyor_executions", (("status", "failed"),))] == 1
    assert scraped[("conveyor_attempts_total", (("status", "failed"),))] == failed == 2
    # the histograms by queue, and how long nodes ran by workflow too
    node = ("queue", "workflow-node")
    assert scraped[("conveyor_job_wait_seconds_count", (node,))] == tries
    assert scraped[("conveyor_job_wait_seconds_count", (("queue", "workflow-execution"),))] == 0
    for never in ("workflow-scheduled", "workflow-webhook"):  # their jobs make no tries
        assert ("conveyor_job_wait_seconds_count", (("queue", never),)) not in scraped
    assert scraped[("conveyor_job_run_seconds_count", (node, ("workflow", "good")))] == 3
    assert scraped[("conveyor_job_run_seconds_count", (node, ("workflow", "bad")))] == 2
    assert sum(v for (name, _), v in scraped.items()
               if name == "conveyor_job_run_seconds_count") == tries  # fmt: skip
    assert sum(v for (name, labels), v in scraped.items()
               if name == "conveyor_jobs" and ("kind", "node") in labels) == node_jobs  # fmt: skip
    # the broker's queues, each at every priority (empty: the worker took everything)
    depths = {labels: v for (name, labels), v in scraped.items() if name == "conveyor_queue_depth"}
    assert len(depths) == 4 * 3
    assert scraped[("conveyor_schedules_late", ())] == 0
    # every status is shown, 0 when none has it: a series never vanishes
    assert scraped[("conveyor_executions", (("status", "cancelled"),))] == 0
    assert scraped[("conveyor_jobs", (("kind", "node"), ("status", "parked")))] == 0
    # the limits' keys are named as `conveyor limits` names them: tenants by name
    tenant, workflow = (("name", "default"), ("scope", "tenant")), (
        ("name", "default/good"), ("scope", "workflow"))  # fmt: skip
    assert scraped[("conveyor_permits_limit", tenant)] == 10
    assert scraped[("conveyor_permits_in_use", workflow)] == 0
    # which Conveyor and Python serve them
    (build,) = [labels for (name, labels), _ in scraped.items() if name == "conveyor_build_info"]
    assert dict(build) == {"version": metadata.version("conveyor"),
                           "python": platform.python_version()}  # fmt: skip


def test_without_the_workflow_label_the_run_histogram_is_by_queue_alone(
    conveyor_service: Conveyor,
) -> None:
    # Given tries of two workflows, and an API told not to label by workflow name
    run_some(conveyor_service)
    settings = Settings(metrics_token=METRICS_TOKEN, metrics_workflow_label=False)

    with served(create_app(conveyor_service, settings)) as url:
        scraped = samples(httpx.get(f"{url}/metrics", headers=SCRAPER, timeout=30).text)

    # Then the run histogram has a series per queue, none per workflow (tenants name those)
    runs = [labels for (name, labels), _ in scraped.items()
            if name == "conveyor_job_run_seconds_count"]  # fmt: skip
    assert runs == [(("queue", "workflow-node"),)]
    assert scraped[("conveyor_job_run_seconds_count", (("queue", "workflow-node"),))] == 5


def test_the_tries_counted_ever_do_not_go_down_when_the_retention_sweep_deletes_them(
    conveyor_service: Conveyor, api_url: str
) -> None:
    # Given tries made, counted by the counters and histograms the metrics show
    def counted() -> dict[str, float]:
        """Every series, and each histogram's summed over its queues and workflows too."""
        scraped = samples(httpx.get(f"{api_url}/metrics", headers=SCRAPER, timeout=30).text)
        shown: dict[str, float] = {}
        for (name, labels), v in scraped.items():
            if not name.startswith(("conveyor_attempts_total", "conveyor_job_")):
                continue
            shown[f"{name}{dict(labels)}"] = v
            if name.startswith("conveyor_job_"):
                summed = f"{name}{dict((k, x) for k, x in labels if k == 'le')}"
                shown[summed] = shown.get(summed, 0.0) + v
        return shown

    def run_and_age() -> None:
        """run_some's executions and one that succeeds at its second try; every try as if it
        waited 20 ms and ran 7 s (each histogram's values in one bucket), 30 days ago"""
        run_some(conveyor_service)
        conveyor_service.apply(parse_workflow(FLAKY))
        assert wait_for(conveyor_service, conveyor_service.trigger("flaky")).status is (
            ExecutionStatus.COMPLETED
        )
        with conveyor_service.db.transaction() as store:
            store.session.execute(update(JobAttempt).values(waited=0.02, duration=7.0))
            store.session.execute(
                update(Execution).values(finished_at=utcnow() - timedelta(days=30))
            )

    def prune() -> int:
        return conveyor_service.prune(timedelta(days=14), batch=2)

    def summed_alike() -> None:
        """The snapshot the alerts and `conveyor stats` read (by status alone, no join) has
        the totals of the labelled one the scrape reads, the pruned tallies' included."""
        labelled = metrics.take(conveyor_service.db, "", None)
        alone = metrics.take(conveyor_service.db, "", None, labelled=False)
        assert (alone.wait_by, alone.run_by) == ({}, {})
        assert labelled.run_by  # the scrape's
        alerts = wiring.alerter(conveyor_service).snapshot()
        assert (alerts.wait_by, alerts.run_by) == ({}, {})
        for snap in (alone, alerts):
            assert snap.attempts == labelled.attempts
            for mine, theirs in ((snap.wait, labelled.wait), (snap.run, labelled.run)):
                assert (mine.buckets, mine.count) == (theirs.buckets, theirs.count)
                assert mine.total == pytest.approx(theirs.total)  # added in another order

    run_and_age()
    before = counted()
    assert before["conveyor_attempts_total{'status': 'failed'}"] == 3
    assert before["conveyor_job_run_seconds_count{}"] == 7
    assert before["conveyor_job_wait_seconds_bucket{'le': '0.01'}"] == 0
    assert before["conveyor_job_wait_seconds_bucket{'le': '0.025'}"] == 7
    assert before["conveyor_job_run_seconds_bucket{'le': '5.0'}"] == 0
    assert before["conveyor_job_run_seconds_bucket{'le': '10.0'}"] == 7
    summed_alike()

    # When every execution is pruned, a batch of two at a time, save the dead-lettered one's
    assert prune() == 4

    # Then the tries are gone from the tables, and every count and sum shows them still
    with conveyor_service.db.transaction() as store:
        left = store.session.scalar(select(func.count()).select_from(JobAttempt))
    assert left == 2  # the dead letter's two tries: its execution is kept
    assert counted() == pytest.approx(before)  # the sums added in another order
    summed_alike()

    # And tries made and pruned later add to them (the tallies' rows updated, not inserted)
    run_and_age()
    again = counted()
    assert again["conveyor_attempts_total{'status': 'succeeded'}"] == 8
    assert again["conveyor_attempts_total{'status': 'failed'}"] == 6
    assert again["conveyor_job_run_seconds_bucket{'le': '10.0'}"] == 14
    assert again["conveyor_job_run_seconds_sum{}"] == pytest.approx(14 * 7.0)
    assert prune() == 4
    assert counted() == pytest.approx(again)
    summed_alike()


def test_the_metrics_are_read_in_one_snapshot_and_the_connection_is_reset_after(
    database_url: str,
) -> None:
    db = Database(database_url)
    try:
        with db.snapshot() as store:
            seen = store.session.execute(
                text("SELECT current_setting('transaction_isolation'), "
                     "current_setting('transaction_read_only')")
            ).one()  # fmt: skip
        assert tuple(seen) == ("repeatable read", "on")
        with db.transaction() as store:  # the pool's one connection, taken again
            seen = store.session.execute(
                text("SELECT current_setting('transaction_isolation'), "
                     "current_setting('transaction_read_only')")
            ).one()  # fmt: skip
        assert tuple(seen) == ("read committed", "off")
        assert db.engine.pool.checkedin() == 1  # type: ignore[attr-defined]
    finally:
        db.dispose()


def test_conveyor_stats_prints_the_same_numbers(conveyor_service: Conveyor) -> None:
    run_some(conveyor_service)

    shown = subprocess.run([*CONVEYOR, "stats", "--json"], env=dict(os.environ), text=True,
                           capture_output=True, timeout=60)  # fmt: skip
    table = subprocess.run([*CONVEYOR, "stats"], env=dict(os.environ), text=True,
                           capture_output=True, timeout=60)  # fmt: skip

    assert shown.returncode == 0, shown.stderr
    stats = json.loads(shown.stdout)
    assert (stats["dead_letters"], stats["executions"]) == (1, {"completed": 3, "failed": 1})
    assert stats["attempts"]["failed"] == 2
    assert "dead letters (discarded)" in table.stdout and "1 (0)" in table.stdout


def test_metrics_need_the_scrapers_token_and_v1_an_api_key(api_url: str) -> None:
    # /metrics is for the operator's scraper alone, /v1 for tenants' keys
    assert httpx.get(f"{api_url}/metrics", headers=SCRAPER).status_code == 200
    assert httpx.get(f"{api_url}/metrics").status_code == 401
    assert httpx.get(f"{api_url}/v1/executions", headers=SCRAPER).status_code == 401
