"""Issue 27's "coming from ..." pages run as they say. Each page's "Run it" block is read from
the markdown and run, line by line as a reader's shell would, in a copy of its example on the
embedded default (the real `conveyor` command, SQLite, worker threads); the skip-locked page's
block for workers runs against PostgreSQL, Redis and a real `celery worker`. Then each outcome
the page promises is checked."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest

from conveyor.service import Conveyor
from tests.acceptance.conftest import ROOT
from tests.acceptance.test_source_systems_policy import settled
from tests.support.doc_blocks import Ran, block_under, reader_env, run_block

DOCS = ROOT / "docs"


def clone_of(example: str, tmp_path: Path) -> Path:
    """A fresh clone as far as the page needs it: its example's files, none of the state a
    run there leaves (the embedded database, the stand-ins' files)."""
    clone = tmp_path / "clone"
    shutil.copytree(
        ROOT / "examples" / "coming-from" / example,
        clone / "examples" / "coming-from" / example,
        ignore=shutil.ignore_patterns(".conveyor", "__pycache__", "*.db", "core-banking-down"),
    )
    return clone


def as_json(directory: Path, *args: str) -> Any:
    """What ``conveyor ARGS --json`` prints, run where the page's commands ran (so on the
    embedded database they made)."""
    done = subprocess.run(
        ["conveyor", *args, "--json"], cwd=directory, env=reader_env(), text=True,
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def said(ran: Ran) -> str:
    return ran.stdout + ran.stderr


@pytest.mark.timeout(300)
def test_the_skip_locked_page_runs_on_the_embedded_default(tmp_path: Path) -> None:
    clone = clone_of("skip-locked", tmp_path)
    commands = block_under(DOCS / "coming-from-skip-locked.md", "## Run it")

    apply, synced, deleted, listed = run_block(commands, clone=clone)

    assert apply.returncode == 0, said(apply)
    # The first run completed: post snoozed three times, on its first attempt
    assert synced.returncode == 0, said(synced)
    assert '"polls": 4' in synced.stdout and '"attempt": 1' in synced.stdout
    here = clone / "examples" / "coming-from" / "skip-locked"
    (row,) = as_json(here, "executions", "list", "--dedupe-key", "ledger:org-7:doc-42")
    assert row["status"] == "completed" and row["id"] in listed.stdout
    shown = as_json(here, "executions", "show", row["id"])
    post = next(n for n in shown["nodes"] if n["id"] == "post")
    assert (post["attempts"], post["snoozes"]) == (1, 3)
    (job,) = [j for j in shown["jobs"] if j["node"] == "post"]
    assert [a["status"] for a in job["attempts"]] == ["snoozed"] * 3 + ["succeeded"]
    # The second ended cancelled by its node, and post never ran
    assert deleted.returncode == 1, said(deleted)
    assert "cancelled by node 'load': document 43 was deleted" in deleted.stdout
    (row,) = as_json(here, "executions", "list", "--dedupe-key", "ledger:org-7:doc-43")
    nodes = as_json(here, "executions", "show", row["id"])["nodes"]
    assert {n["id"]: (n["status"], n["attempts"]) for n in nodes} == {
        "load": ("cancelled", 1), "post": ("cancelled", 0),
    }  # fmt: skip


@pytest.mark.timeout(300)
def test_the_skip_locked_page_with_workers_runs_newer_input_as_a_follow_up(
    tmp_path: Path,
    client: Conveyor,
    start_worker: Callable[..., Popen[str]],
    acceptance_env: dict[str, str],
) -> None:
    # Given the workers the page asks for, run from the example's directory
    clone = clone_of("skip-locked", tmp_path)
    here = clone / "examples" / "coming-from" / "skip-locked"
    env = {"CONVEYOR_IMPORTS": "accounting", "PYTHONPATH": f"{here}:{ROOT}"}
    start_worker("workflow-execution,workflow-node", concurrency=1, name="ledger", env=env)
    services = {k: acceptance_env[k] for k in ("CONVEYOR_DATABASE_URL", "CONVEYOR_BROKER_URL")}
    page = DOCS / "coming-from-skip-locked.md"
    commands = block_under(page, "## Newer input while one is active")

    # When the page's commands run, the page's placeholder URLs replaced by the test's services
    upgrade, apply, first, second, third = run_block(commands, clone=clone, overrides=services)

    for ran in (upgrade, apply, first, second, third):
        assert ran.returncode == 0, said(ran)
    # Then versions 2 and 3 were answered with the active execution, as a follow-up
    assert second.stdout == third.stdout == first.stdout
    assert "follow-up queued" in second.stderr and "follow-up queued" in third.stderr
    # And once all ran: version 1's execution, then one follow-up with version 3
    runs = settled(client, "ledger:org-7:doc-44", 2)
    assert [run[2]["version"] for run in runs] == [1, 3]
    listed = subprocess.run(
        ["conveyor", "executions", "list", "--dedupe-key", "ledger:org-7:doc-44", "--json"],
        env={**reader_env(), **services}, text=True, capture_output=True, timeout=60,
    )  # fmt: skip
    rows = json.loads(listed.stdout)
    assert [r["status"] for r in rows] == ["completed", "completed"]
    assert [str(run[0]) for run in reversed(runs)] == [r["id"] for r in rows]


@pytest.mark.timeout(300)
def test_the_async_operations_page_runs_on_the_embedded_default(tmp_path: Path) -> None:
    clone = clone_of("async-operations", tmp_path)
    commands = block_under(DOCS / "coming-from-async-operations.md", "## Run it")

    ran = run_block(commands, clone=clone)

    apply, a1, a2, a3, down, a4, dead, up, requeue, failed, stats = ran
    here = clone / "examples" / "coming-from" / "async-operations"
    for step in (apply, a1, down, dead, up, requeue, failed, stats):
        assert step.returncode == 0, said(step)
    # A-1 completed on its third try of five
    assert '"try": 3' in a1.stdout
    # A-2 had two tries, not the type's five: a dead letter
    assert a2.returncode == 1 and "failed after 2 attempt(s)" in a2.stdout
    # A-3 was cancelled by its node
    assert a3.returncode == 1 and "cancelled by node 'send': account A-3 is closed" in a3.stdout
    # A-4 was a dead letter after the type's two tries, listed with A-2's
    assert a4.returncode == 1 and "failed after 2 attempt(s)" in a4.stdout
    assert "refresh-balance" in dead.stdout and "send-statement" in dead.stdout
    letters = {row["workflow"]: row["tries"] for row in as_json(here, "dlq", "list")}
    assert letters == {"send-statement": 2}  # A-4's is no dead letter once requeued
    # The requeue resumed A-4, which completed on its first new try
    assert "requeued" in requeue.stdout and '"refreshed": "A-4"' in requeue.stdout
    (a4_row,) = as_json(here, "executions", "list", "--workflow", "refresh-balance")
    (job,) = as_json(here, "executions", "show", a4_row["id"])["jobs"][-1:]
    assert [a["status"] for a in job["attempts"]] == ["failed", "failed", "succeeded"]
    # The failed statements are A-2 alone
    (a2_row,) = as_json(here, "executions", "list", "--workflow", "send-statement", "--status",
                        "failed")  # fmt: skip
    assert a2_row["id"] in failed.stdout
    # The status view, by type and status
    view = {(r["workflow"], r["status"]): (r["count"], r["average_attempts"])
            for r in as_json(here, "executions", "stats")}  # fmt: skip
    assert view == {
        ("refresh-balance", "completed"): (1, 3.0),
        ("send-statement", "cancelled"): (1, 1.0),
        ("send-statement", "completed"): (1, 3.0),
        ("send-statement", "failed"): (1, 2.0),
    }
    assert "refresh-balance" in stats.stdout and "3.00" in stats.stdout


def records(ran: Ran) -> list[dict[str, Any]]:
    """The JSON log lines a command wrote to stderr."""
    return [json.loads(line) for line in ran.stderr.splitlines() if line.startswith("{")]


@pytest.mark.timeout(300)
def test_the_queue_consumer_page_runs_on_the_embedded_default(tmp_path: Path) -> None:
    clone = clone_of("queue-consumer", tmp_path)
    commands = block_under(DOCS / "coming-from-a-queue-consumer.md", "## Run it")

    ran = run_block(commands, clone=clone)

    apply, paid, again, poison, dead, discard, archived = ran
    here = clone / "examples" / "coming-from" / "queue-consumer"
    for step in (apply, paid, again, dead, discard, archived):
        assert step.returncode == 0, said(step)
    # S-1 was paid on its second try, and the JSON logs said so, by level
    assert '"try": 2' in paid.stdout
    logged = [(r["event"], r["level"]) for r in records(paid) if r.get("node_id") == "pay"
              or r.get("logger") == "settlement"]  # fmt: skip
    assert logged == [
        ("job received", "info"), ("retry scheduled", "warning"), ("job received", "info"),
        ("paid out", "info"), ("job completed", "info"),
    ]  # fmt: skip
    assert next(r for r in records(paid) if r["event"] == "paid out")["settlement"] == "S-1"
    # S-1 again: skipped, the execution completed, one payout in all
    rows = as_json(here, "executions", "list", "--workflow", "settle")
    second = as_json(here, "executions", "show", rows[1]["id"])
    assert (second["status"], second["nodes"][0]["status"]) == ("completed", "skipped")
    assert "skipped" in again.stdout
    with sqlite3.connect(here / "payouts.db") as db:
        assert db.execute("SELECT settlement, amount FROM payouts").fetchall() == [("S-1", 120.5)]
    # S-2: a dead letter at once, logged as an error without -v
    assert poison.returncode == 1 and "failed after 1 attempt(s)" in poison.stdout
    assert [(r["event"], r["level"]) for r in records(poison)] == [("dead-lettered", "error")]
    assert "S-2" in dead.stdout and "not > 0" in dead.stdout
    # Discarded: gone from the dead letters, kept in the archive
    assert as_json(here, "dlq", "list") == []
    (kept,) = as_json(here, "dlq", "list", "--archived")
    assert (kept["status"], kept["tries"]) == ("discarded", 1)
    assert kept["job_id"] in archived.stdout
