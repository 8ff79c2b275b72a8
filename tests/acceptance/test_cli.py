"""The `conveyor` command as a person runs it: the demo on a fresh machine, and the
production path against PostgreSQL, Redis and a real `celery worker`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen

from tests.acceptance.conftest import ROOT, await_ready

CONVEYOR = [str(Path(sys.executable).parent / "conveyor")]  # the installed console script


def conveyor(
    *args: str, env: dict[str, str], cwd: Path = ROOT, timeout: float | None = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``conveyor ARGS``; ``timeout=None`` leaves a command that waits for an execution
    to its test's own timeout."""
    return subprocess.run(
        [*CONVEYOR, *args], env=env, cwd=cwd, text=True, capture_output=True, timeout=timeout
    )


# Runs `conveyor ARGS` for each ARGS in turn in one process, as the console script runs one
# (`conveyor.cli.main`'s app), and prints what each did: its exit status, stdout and stderr.
_SESSION = """\
import contextlib, io, json, sys
from conveyor.cli.main import app
done = []
for args in json.loads(sys.argv[1]):
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            app(args, prog_name="conveyor")
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    done.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(done))
"""


def conveyor_session(
    *commands: list[str], env: dict[str, str], cwd: Path = ROOT
) -> list[subprocess.CompletedProcess[str]]:
    """Run several ``conveyor`` commands one after the other in a single process: what each
    printed and its exit status, as :func:`conveyor` gives them. For the reads that check a
    test's outcome, which would each pay the CLI's start-up (about a second; several under
    load) in a process of their own."""
    ran = subprocess.run(
        [sys.executable, "-c", _SESSION, json.dumps(commands)],
        env=env, cwd=cwd, text=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return [
        subprocess.CompletedProcess(["conveyor", *args], code, out, err)
        for args, (code, out, err) in zip(commands, json.loads(ran.stdout), strict=True)
    ]


def test_demo_runs_on_the_embedded_default_in_an_empty_directory(tmp_path: Path) -> None:
    # Given a fresh directory and no CONVEYOR_* settings at all
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}

    result = conveyor("demo", env=env, cwd=tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "fetched after 3 tries" in result.stdout  # the flaky node succeeded on its 3rd try
    assert '"total": 70' in result.stdout  # the diamond joined its parallel branches
    assert (tmp_path / ".conveyor" / "conveyor.db").exists()


MYNODES = """\
import conveyor


@conveyor.node("greet")
def greet(name: str) -> dict[str, str]:
    return {"greeting": f"hello {name}"}
"""
GREET = """\
name: greet
nodes:
  - {id: hello, type: python, config: {function: greet}, inputs: {name: "{{ input.name }}"}}
output: {greeting: "{{ nodes.hello.greeting }}"}
"""


def test_run_json_from_a_project_directory_prints_only_json_and_logs_to_stderr(
    tmp_path: Path,
) -> None:
    # Given a project directory holding its own node module, with no PYTHONPATH set
    (tmp_path / "mynodes.py").write_text(MYNODES)
    (tmp_path / "greet.yaml").write_text(GREET)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CONVEYOR_") and k != "PYTHONPATH"}  # fmt: skip
    env["CONVEYOR_IMPORTS"] = "mynodes"

    # When it runs the workflow with -vv (-q and the default: tests/unit/test_cli_validate.py)
    run = conveyor("-vv", "run", "greet.yaml", "--json", "-i", '{"name": "ada"}', env=env,
                   cwd=tmp_path)  # fmt: skip

    # Then stdout is the JSON alone; the logs, info and debug among them, went to stderr
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout)["output"] == {"greeting": "hello ada"}
    assert "[debug" in run.stderr
    assert any("[info" in line and "job received" in line for line in run.stderr.splitlines())


def test_run_wait_json_against_real_workers(
    acceptance_env: dict[str, str], start_worker: Callable[..., Popen[str]], client: object
) -> None:
    env = {**acceptance_env, "CONVEYOR_IMPORTS": "conveyor.demo"}
    run = run_example(start_worker, env, "flaky", "{}")

    assert run.returncode == 0, run.stdout + run.stderr
    outcome = json.loads(run.stdout)
    assert outcome["status"] == "completed"
    assert outcome["output"] == {"message": "fetched after 3 tries"}
    # ... and the retention sweep, by hand with no retention, deletes it
    shown, pruned, gone = conveyor_session(
        ["executions", "show", outcome["execution_id"], "--json"],
        ["db", "prune", "--older-than", "0"],
        ["executions", "show", outcome["execution_id"]],
        env=env,
    )
    detail = json.loads(shown.stdout)
    fetch = next(n for n in detail["nodes"] if n["id"] == "fetch")
    assert fetch["attempts"] == 3 and fetch["status"] == "completed"
    assert pruned.returncode == 0, pruned.stderr
    assert int(pruned.stdout.split()[0]) >= 1 and "older than 0 day(s)" in pruned.stdout
    assert gone.returncode != 0 and "no execution" in gone.stderr


def test_run_exits_1_when_the_execution_fails(
    acceptance_env: dict[str, str], start_worker: Callable[..., Popen[str]], client: object
) -> None:
    env = {**acceptance_env, "CONVEYOR_IMPORTS": "conveyor.demo"}
    run = run_example(start_worker, env, "branching", '{"amount": "abc"}')

    assert run.returncode == 1, run.stdout + run.stderr
    assert json.loads(run.stdout)["status"] == "failed"


def run_example(
    start_worker: Callable[..., Popen[str]], env: dict[str, str], name: str, given: str
) -> subprocess.CompletedProcess[str]:
    """`conveyor workflow apply examples/NAME.yaml`, then `conveyor run NAME --input GIVEN
    --wait --json` (60 s at most), in one process, while a worker for the execution and node
    queues starts beside them (what the run publishes meanwhile waits for it); the run."""
    worker = start_worker("workflow-execution,workflow-node", concurrency=2, name="cli", env=env,
                          wait=False)  # fmt: skip
    applied, run = conveyor_session(
        ["workflow", "apply", f"examples/{name}.yaml"],
        ["run", name, "--input", given, "--wait", "--json", "--timeout", "60"],
        env=env,
    )
    await_ready(worker)  # its log, if it never started
    assert applied.returncode == 0, applied.stderr
    return run
