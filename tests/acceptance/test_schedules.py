"""Cron schedules with real ``celery beat`` and ``celery worker`` processes, and the
``conveyor schedules`` command as an operator runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from subprocess import Popen

from sqlalchemy import select

from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution, Job, JobAttempt
from conveyor.service import Conveyor
from tests.acceptance.conftest import await_ready
from tests.acceptance.test_cli import conveyor, conveyor_session
from tests.support.services import wait_for

Start = Callable[..., Popen[str]]
RECORDER = {
    "name": "tick",
    "nodes": [
        {
            "id": "add",
            "type": "python",
            "config": {"function": "test.add"},
            "inputs": {"a": 1, "b": 1},
        }
    ],
}


def scheduled_runs(client: Conveyor) -> list[tuple[Execution, datetime]]:
    """Each scheduled execution with the moment its node's first try started."""
    with client.db.transaction() as store:
        rows = store.session.execute(
            select(Execution, JobAttempt.started_at)
            .join(Job, Job.execution_id == Execution.id)
            .join(JobAttempt, JobAttempt.job_id == Job.id)
            .where(Execution.trigger == "schedule", Job.node_id.is_not(None))
            .order_by(Execution.scheduled_for)
        ).all()
        return [(execution, started) for execution, started in rows]


def test_two_beats_start_each_minute_once_within_two_seconds_of_the_minute(
    client: Conveyor,
    start_worker: Start,
    start_beat: Start,
    acceptance_env: dict[str, str],
    tmp_path: Path,
) -> None:
    # Given idle worker pools for the four kinds of work, and two beats sending checks
    heartbeat = {"CONVEYOR_BEAT_HEARTBEAT_FILE": str(tmp_path / "beat1.heartbeat")}
    await_ready(
        start_worker("workflow-scheduled", concurrency=2, name="scheduled", wait=False),
        start_worker("workflow-execution", concurrency=1, name="exec", wait=False),
        start_worker("workflow-node", concurrency=1, name="node", wait=False),
        start_beat("beat1", env=heartbeat, wait=False),
        start_beat("beat2", wait=False),
    )
    # and an every-minute schedule added by an operator: its first slot M is the next minute
    client.apply(parse_workflow(RECORDER))
    minute = add_every_minute(client, acceptance_env)

    # When the minute comes, each beat's check of it has run, and a run's node has started
    until = time.monotonic() + (minute - datetime.now(UTC)).total_seconds() + 30
    while (checks := checks_run_since(tmp_path / "scheduled.log", minute)) < 2 or not (
        scheduled_runs(client)
    ):
        assert time.monotonic() < until, f"30 s past the minute: {checks} check(s) of it ran"
        time.sleep(0.2)

    # Then exactly one run started for it, and its node within two seconds of M:00
    runs = scheduled_runs(client)
    assert [execution.scheduled_for for execution, _ in runs] == [minute], runs
    execution, node_started = runs[0]
    assert wait_for(client, execution.id).status is ExecutionStatus.COMPLETED
    lag = (node_started - minute).total_seconds()
    assert 0 <= lag < 2, lag
    listed = json.loads(conveyor("schedules", "list", "--json", env=acceptance_env).stdout)
    assert [(s["name"], s["run_count"]) for s in listed] == [("tick", 1)]
    assert listed[0]["next_run_at"] == (minute + timedelta(minutes=1)).isoformat()
    # and the beat that keeps a heartbeat passes its liveness check (it ticked in the minute)
    check = subprocess.run(
        [sys.executable, "-m", "conveyor.scheduler.heartbeat"],
        env={**acceptance_env, **heartbeat}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr


def add_every_minute(client: Conveyor, env: dict[str, str]) -> datetime:
    """Add the every-minute schedule `tick` with `conveyor schedules add`; its first slot.
    Added again if the command ended less than a second before that slot: the beats' check
    of it, sent on the minute, may then have run before the schedule was stored."""
    while True:
        added = conveyor("schedules", "add", "tick", "--cron", "* * * * *", env=env)
        assert added.returncode == 0, added.stderr
        with client.db.transaction() as store:
            [schedule] = store.schedules(None)
        if schedule.next_run_at - datetime.now(UTC) > timedelta(seconds=1):
            return schedule.next_run_at
        assert conveyor("schedules", "remove", "tick", env=env).returncode == 0


def checks_run_since(log: Path, since: datetime) -> int:
    """The due checks a worker logged as done at or after ``since`` (its complete lines)."""
    lines = log.read_text().split("\n")[:-1]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    return sum(
        1
        for r in records
        if r.get("logger") == "celery.app.trace"
        and r["event"].startswith("Task conveyor.scheduled.check[")
        and " succeeded in " in r["event"]
        and datetime.fromisoformat(r["timestamp"]) >= since
    )


def test_the_schedules_command_refuses_bad_input_and_manages_a_schedule(
    client: Conveyor, acceptance_env: dict[str, str]
) -> None:
    client.apply(parse_workflow(RECORDER))

    # (the commands in one process: each pays the CLI's start-up once, not six times)
    bad, good, *verbs, gone = conveyor_session(
        ["schedules", "add", "tick", "--cron", "0 9 * *", "--timezone", "Europe/Pariss"],
        ["schedules", "add", "tick", "--cron", "0 9 * * 1-5", "--timezone", "Europe/Paris",
         "--name", "mornings"],
        *(["schedules", verb, "mornings"] for verb in ("pause", "resume", "remove")),
        ["schedules", "pause", "mornings"],
        env=acceptance_env,
    )  # fmt: skip

    assert bad.returncode == 1
    assert "has 4 field(s); write five" in bad.stderr
    assert "unknown timezone 'Europe/Pariss' (did you mean 'Europe/Paris'?)" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert good.returncode == 0, good.stderr
    assert "tick at 09:00 on Monday through Friday (0 9 * * 1-5, Europe/Paris)" in good.stdout
    # and says what starts its runs when a broker is configured
    assert "its runs start while `celery -A conveyor.tasks beat` runs" in good.stdout
    for done in verbs:
        assert done.returncode == 0, done.stderr
    assert gone.returncode == 1
    assert "no schedule named 'mornings'" in gone.stderr
    with client.db.transaction() as store:
        assert store.schedules(None) == []  # the bad add left nothing half-written


def test_applying_a_definition_with_schedules_says_what_starts_their_runs(
    client: Conveyor, acceptance_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "tick.yaml").write_text(json.dumps({**RECORDER, "schedules": [{"cron": "@daily"}]}))
    (tmp_path / "plain.yaml").write_text(json.dumps({**RECORDER, "name": "plain"}))
    files = [str(tmp_path / "plain.yaml"), str(tmp_path / "tick.yaml")]

    applied = conveyor("workflow", "apply", *files, env=acceptance_env)

    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.splitlines()[-1] == (
        "the schedules of tick: their runs start while `celery -A conveyor.tasks beat` runs, "
        "with workers serving workflow-scheduled and the workflow's queues"
    )
