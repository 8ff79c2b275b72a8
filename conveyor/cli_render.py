"""What the CLI prints: the stable JSON shapes (see docs/cli.md) and the rich tables.

The JSON shapes are TypedDicts built from the store's rows; the tables render those same
dicts, so ``--json`` and the human output never disagree. UUIDs are strings, timestamps ISO 8601
in UTC, enums their string values.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Protocol, TypedDict

from rich.console import Console, Group
from rich.live import Live
from rich.table import Column, Table
from rich.text import Text

from conveyor.engine.limits import KeyUsage
from conveyor.engine.records import WorkflowRecord
from conveyor.models import Execution, Job, JobAttempt, NodeState

# Piped output is not cut at 80 columns, so that ids and errors stay whole.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False)

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
STATUS_STYLE = {
    "pending": "dim",
    "queued": "blue",
    "retrying": "magenta",
    "waiting": "blue",
    "running": "yellow",
    "completed": "green",
    "failed": "red",
    "skipped": "dim",
    "cancelled": "red",
    "succeeded": "green",
    "retry_wait": "magenta",
    "scheduled": "blue",
    "processing": "yellow",
    "dead_letter": "red",
}


class AttemptJson(TypedDict):
    number: int
    status: str
    error: str | None
    worker: str | None
    started_at: str
    finished_at: str | None
    duration: float | None
    timed_out: bool


class JobJson(TypedDict):
    id: str
    kind: str
    node: str | None
    queue: str
    status: str
    priority: str
    next_run_at: str | None
    last_error: str | None
    attempts: list[AttemptJson]


class NodeJson(TypedDict):
    id: str
    status: str
    branch: str | None
    attempts: int
    output: Any
    error: str | None
    started_at: str | None
    finished_at: str | None
    duration: float | None


class ExecutionSummaryJson(TypedDict):
    id: str
    workflow: str
    version: int
    status: str
    priority: str
    trigger: str
    error: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    duration: float | None


class ExecutionJson(ExecutionSummaryJson):
    input: Any
    output: Any
    nodes: list[NodeJson]
    jobs: list[JobJson]


class WorkflowJson(TypedDict):
    id: str
    name: str
    version: int
    description: str
    nodes: int
    digest: str
    created_at: str


# -- JSON ------------------------------------------------------------------------------------


def iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None


def seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def execution_summary(row: Execution, workflow: str, version: int) -> ExecutionSummaryJson:
    return {
        "id": str(row.id),
        "workflow": workflow,
        "version": version,
        "status": row.status.value,
        "priority": row.priority.value,
        "trigger": row.trigger,
        "error": row.error,
        "created_at": iso(row.created_at) or "",
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
        "duration": seconds(row.started_at, row.finished_at),
    }


def execution_json(
    row: Execution,
    workflow: WorkflowRecord,
    nodes: Sequence[NodeState],
    jobs: Sequence[tuple[Job, list[JobAttempt]]],
) -> ExecutionJson:
    tries = {job.node_id: len(attempts) for job, attempts in jobs if job.node_id}
    return {
        **execution_summary(row, workflow.name, workflow.version),
        "input": row.input,
        "output": row.output,
        "nodes": [_node_json(n, tries.get(n.node_id, 0)) for n in nodes],
        "jobs": [_job_json(job, attempts) for job, attempts in jobs],
    }


def _node_json(row: NodeState, attempts: int) -> NodeJson:
    return {
        "id": row.node_id,
        "status": row.status.value,
        "branch": row.branch,
        "attempts": attempts,
        "output": row.output,
        "error": row.error,
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
        "duration": seconds(row.started_at, row.finished_at),
    }


def _job_json(row: Job, attempts: list[JobAttempt]) -> JobJson:
    return {
        "id": str(row.id),
        "kind": row.kind.value,
        "node": row.node_id,
        "queue": row.queue,
        "status": row.status.value,
        "priority": row.priority.value,
        "next_run_at": iso(row.next_run_at),
        "last_error": row.last_error,
        "attempts": [_attempt_json(a) for a in attempts],
    }


def _attempt_json(row: JobAttempt) -> AttemptJson:
    return {
        "number": row.attempt_number,
        "status": row.status.value,
        "error": row.error,
        "worker": row.worker,
        "started_at": iso(row.started_at) or "",
        "finished_at": iso(row.finished_at),
        "duration": round(row.duration, 3) if row.duration is not None else None,
        "timed_out": row.timed_out,
    }


def workflow_json(record: WorkflowRecord) -> WorkflowJson:
    definition = record.definition
    return {
        "id": str(record.id),
        "name": record.name,
        "version": record.version,
        "description": str(definition.get("description", "")),
        "nodes": len(definition.get("nodes", [])),
        "digest": record.digest,
        "created_at": iso(record.created_at) or "",
    }


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


# -- tables ----------------------------------------------------------------------------------


def styled(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def fmt_seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f} s"


def fmt_time(value: str | None) -> str:
    return "" if value is None else value[:19].replace("T", " ") + "Z"


def workflows_table(rows: Sequence[WorkflowJson]) -> Table:
    table = Table("name", "version", "nodes", "stored at", "description", box=None)
    for w in rows:
        table.add_row(
            w["name"],
            str(w["version"]),
            str(w["nodes"]),
            fmt_time(w["created_at"]),
            w["description"],
        )
    return table


def executions_table(rows: Sequence[ExecutionSummaryJson]) -> Table:
    table = Table(
        Column("id", no_wrap=True, min_width=36),
        "workflow",
        "status",
        "created at",
        "duration",
        "error",
        box=None,
    )
    for e in rows:
        table.add_row(
            e["id"],
            f"{e['workflow']} v{e['version']}",
            styled(e["status"]),
            fmt_time(e["created_at"]),
            fmt_seconds(e["duration"]),
            short(e["error"] or "", 50),
        )
    return table


def progress_table(view: ExecutionJson, now: datetime) -> Table:
    """One row per node: the live view of ``run --wait`` and the node list of ``show``."""
    jobs = {j["node"]: j for j in view["jobs"] if j["node"]}
    table = Table("node", "status", "attempts", "duration", "detail", box=None)
    for node in view["nodes"]:
        job = jobs.get(node["id"])
        table.add_row(
            node["id"],
            styled(_node_status(node, job)),
            str(node["attempts"] or ""),
            fmt_seconds(_running_for(node, now)),
            _detail(node),
        )
    return table


def _node_status(node: NodeJson, job: JobJson | None) -> str:
    if node["status"] == "queued" and job is not None:
        names = {"retry_wait": "retrying", "scheduled": "waiting", "parked": "parked"}
        return names.get(job["status"], "queued")
    return node["status"]


def _running_for(node: NodeJson, now: datetime) -> float | None:
    if node["duration"] is not None or node["started_at"] is None:
        return node["duration"]
    if node["status"] not in ("running", "queued"):
        return None
    return seconds(datetime.fromisoformat(node["started_at"]), now)


def _detail(node: NodeJson) -> Text:
    if node["error"]:
        return Text(short(node["error"]), style="red")
    if node["status"] == "completed":
        return Text(short(node["output"]), style="dim")
    return Text("")


def execution_header(view: ExecutionSummaryJson) -> Text:
    text = Text.assemble(
        (f"{view['workflow']} v{view['version']}", "bold"), "  execution ", view["id"], "  "
    )
    return text.append_text(styled(view["status"]))


def attempts_table(view: ExecutionJson) -> Table:
    table = Table("job", "attempt", "status", "started at", "duration", "error", box=None)
    for job in view["jobs"]:
        label = job["node"] or "(plan)"
        for a in job["attempts"]:
            table.add_row(
                label,
                str(a["number"]),
                styled(a["status"]),
                fmt_time(a["started_at"]),
                fmt_seconds(a["duration"]),
                Text(short(a["error"] or ""), style="red"),
            )
    return table


def print_execution(view: ExecutionJson) -> None:
    out.print(execution_header(view))
    out.print(f"created {fmt_time(view['created_at'])}   input {short(view['input'])}")
    out.print()
    out.print(progress_table(view, datetime.now(UTC)))
    out.print()
    out.print(attempts_table(view))
    print_outcome(view)


def print_outcome(view: ExecutionJson) -> None:
    status = view["status"]
    if status == "completed":
        took = fmt_seconds(view["duration"])
        out.print(Text.assemble(("completed", "green bold"), f" in {took}"))
        out.print_json(json.dumps(view["output"]))
    elif status in ("failed", "cancelled"):
        out.print(Text.assemble((status, "red bold"), ": ", view["error"] or ""))
    else:
        out.print(
            Text.assemble(
                "still ",
                styled(status),
                f"; follow it with `conveyor executions show {view['id']}`",
            )
        )


# -- logs ----------------------------------------------------------------------------------


class OneLine(logging.Formatter):
    """A record as one line: an exception's message without its traceback (-v shows it)."""

    def format(self, record: logging.LogRecord) -> str:
        error = record.exc_info[1] if record.exc_info else None
        bare = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        line = super().format(bare)
        return f"{line}: {error}" if error is not None else line


def setup_logging(verbose: bool) -> None:
    """Errors only, one line each; everything from INFO with tracebacks when ``verbose``.

    Node failures and retries are shown in the tables already."""
    handler = logging.StreamHandler()
    handler.setFormatter((logging.Formatter if verbose else OneLine)(LOG_FORMAT))
    logging.basicConfig(level=logging.INFO if verbose else logging.ERROR, handlers=[handler])


# -- live progress ---------------------------------------------------------------------------


class Show(Protocol):
    def __call__(self, view: ExecutionJson) -> None: ...


@contextmanager
def live_progress(enabled: bool) -> Iterator[Show]:
    """A callable that redraws the node table with each new view (a no-op when disabled)."""
    if not enabled:
        yield lambda view: None
        return
    with Live(console=out, refresh_per_second=10, transient=False) as live:

        def show(view: ExecutionJson) -> None:
            now = datetime.now(UTC)
            live.update(Group(execution_header(view), progress_table(view, now)))

        yield show
    if not out.is_terminal:
        out.line()  # a non-interactive Live leaves the cursor after its last frame


class LimitJson(TypedDict):
    scope: str  # global, tenant or workflow
    name: str  # "" for global, the tenant's name, or tenant/workflow
    in_use: int
    limit: int
    waiting: int


def limit_json(usage: KeyUsage, tenant_names: dict[str, str]) -> LimitJson:
    name = ""
    if usage.kind == "tenant":
        tenant_id = usage.key.split(":", 1)[1]
        name = tenant_names.get(tenant_id, tenant_id)
    elif usage.kind == "workflow":
        _, tenant_id, workflow = usage.key.split(":", 2)
        name = f"{tenant_names.get(tenant_id, tenant_id)}/{workflow}"
    return {
        "scope": usage.kind,
        "name": name,
        "in_use": usage.in_use,
        "limit": usage.limit,
        "waiting": usage.waiting,
    }


def limits_table(rows: Sequence[LimitJson]) -> Table:
    table = Table("scope", "name", "in use", "limit", "waiting", box=None)
    for r in rows:
        full = r["in_use"] >= r["limit"]
        table.add_row(
            r["scope"],
            r["name"],
            Text(str(r["in_use"]), style="yellow" if full else ""),
            str(r["limit"]),
            Text(str(r["waiting"]), style="yellow" if r["waiting"] else ""),
        )
    return table
