"""What the CLI prints: the stable JSON shapes (see docs/cli.md) and the rich tables.

The JSON shapes are TypedDicts built from the store's rows; the tables render those same
dicts, so ``--json`` and the human output never disagree. UUIDs are strings, timestamps ISO 8601
in UTC, enums their string values.
"""

from __future__ import annotations

import json
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
from conveyor.views import (
    ExecutionJson,
    ExecutionSummaryJson,
    FollowUpJson,
    ItemJson,
    ItemsJson,
    JobJson,
    NodeJson,
    StatusCountJson,
    WorkflowJson,
    seconds,
)

# Piped output is not cut at 80 columns, so that ids and errors stay whole.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False)

STATUS_STYLE = {
    "pending": "dim",
    "queued": "blue",
    "retrying": "magenta",
    "waiting": "blue",
    "snoozed": "blue",
    "running": "yellow",
    "completed": "green",
    "failed": "red",
    "skipped": "dim",
    "cancelled": "red",
    "succeeded": "green",
    "retry_wait": "magenta",
    "scheduled": "blue",
    "held": "dim",
    "processing": "yellow",
    "dead_letter": "red",
    "waiting_child": "blue",
    "waiting_event": "blue",
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


def status_counts_table(rows: Sequence[StatusCountJson]) -> Table:
    table = Table("workflow", "status", "count", "oldest", "newest", "avg tries", box=None)
    for r in rows:
        table.add_row(
            r["workflow"], styled(r["status"]), str(r["count"]), fmt_time(r["oldest"]),
            fmt_time(r["newest"]), f"{r['average_attempts']:.2f}",
        )  # fmt: skip
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
        last = job["attempts"][-1:]
        if job["status"] == "retry_wait" and last and last[0]["status"] == "snoozed":
            return "snoozed"
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
    items = node.get("items")
    if items is not None and node["status"] != "completed":
        return Text(items_detail(items), style="dim")
    if node["status"] == "waiting" and node["child"]:
        return Text(f"waits for child {node['child']}", style="dim")
    if node["heartbeat_age"] is not None:
        beat = f"heartbeat {fmt_seconds(node['heartbeat_age'])} ago"
        return Text(f"on {node['worker']}, {beat}" if node["worker"] else beat, style="dim")
    if node["error"]:
        return Text(short(node["error"]), style="red")
    if node["status"] == "completed":
        return Text(short(node["output"]), style="dim")
    return Text("")


def items_detail(items: ItemsJson) -> str:
    """A map's items in a line: how many, and how many in each status."""
    counts = ", ".join(f"{n} {status}" for status, n in items["statuses"].items())
    return f"{items['total']} items: {counts}"


def failed_items_table(view: ExecutionJson) -> Table | None:
    """The failed items of the execution's maps (the first of each), or None: none failed."""
    table = Table("node", "item", "job", "error", box=None)
    for node in view["nodes"]:
        items = node.get("items")
        for failed in items["failures"] if items is not None else []:
            table.add_row(
                node["id"], str(failed["index"]), failed["job_id"],
                Text(short(failed["error"] or "", 80), style="red"),
            )  # fmt: skip
    return table if table.row_count else None


def items_table(rows: Sequence[ItemJson]) -> Table:
    children = any(item["child"] for item in rows)  # a map of children: each item's child
    table = Table("item", "status", "attempts", "job", *(["child"] if children else []),
                  "output or error", box=None)  # fmt: skip
    for item in rows:
        shown = (
            Text(short(item["error"]), style="red")
            if item["error"] and item["status"] != "completed"
            else Text(short(item["output"]), style="dim")
        )
        table.add_row(
            str(item["index"]), styled(item["status"]), str(item["attempts"]), item["job_id"],
            *([item["child"] or ""] if children else []), shown,
        )  # fmt: skip
    return table


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
    out.print(
        f"created {fmt_time(view['created_at'])}   input {short(view['input'])}", markup=False
    )
    if (follow := view.get("follow_up")) is not None:
        print_follow_up(follow)
    if (scheduled := view.get("scheduled_for")) is not None:
        out.print(f"scheduled for {fmt_time(scheduled)}")
    attempts, timeout = view.get("max_attempts"), view.get("timeout")
    if attempts is not None or timeout is not None:
        given = [f"max attempts {attempts}" if attempts is not None else "",
                 f"timeout {timeout:g} s" if timeout is not None else ""]  # fmt: skip
        out.print("trigger's limits: " + ", ".join(g for g in given if g))
    for rerun in view.get("reruns", []):
        given_input = f", input {short(rerun['input'])}" if rerun["input"] is not None else ""
        out.print(
            f"re-run from {rerun['from_node']} by {rerun['requested_by']} at "
            f"{fmt_time(rerun['requested_at'])}{given_input}",
            markup=False,
        )
    if (parent := view["parent"]) is not None:
        item = "" if parent["item_index"] is None else f", item {parent['item_index']}"
        out.print(
            f"child of execution {parent['execution_id']} (workflow "
            f"{parent['workflow'] or '(deleted)'}, node {parent['node']}{item}, try "
            f"{parent['try_number']}), depth {view['depth']}",
            markup=False,
        )
    out.print()
    out.print(progress_table(view, datetime.now(UTC)))
    if (failed := failed_items_table(view)) is not None:
        out.print()
        out.print(Text("failed items", style="bold"))
        out.print(failed)
    out.print()
    out.print(attempts_table(view))
    if view["children"]:
        out.print()
        out.print(children_table(view))
    print_outcome(view)


def print_follow_up(follow: FollowUpJson) -> None:
    given = follow["input"]
    shown = short(given) if given is not None else f"of {follow['input_bytes']:,} bytes"
    left = f", left {fmt_time(follow['left_at'])}" if follow["left_at"] else ""
    out.print(
        f"follow-up {follow['status']}{left}: input {shown}; it runs once this execution "
        "completes or fails",
        markup=False,
        soft_wrap=True,
    )


def print_stream_event(event_id: str, kind: str, data: dict[str, Any], as_json: bool) -> None:
    """One event of a tenant's stream, as it comes: a line of JSON, or a line for people."""
    if as_json:
        print(json.dumps({"id": event_id, "kind": kind, "data": data}), flush=True)
        return
    line = Text.assemble(
        fmt_time(str(data["at"])), "  ", str(data["execution_id"]), "  ",
        f"{data['workflow']} v{data['version']}", "  ", styled(str(data["status"])),
    )  # fmt: skip
    if data.get("dedupe_key") is not None:
        line.append(f"  dedupe key {data['dedupe_key']}")
    line.append(f"  (event {event_id})", style="dim")
    out.print(line, soft_wrap=True)


def children_table(view: ExecutionJson) -> Table:
    """The children its workflow nodes started, newest first (the newest shown of all)."""
    shown, count = len(view["children"]), view["children_count"]
    title = f"children ({count})" if shown == count else f"children (newest {shown} of {count})"
    table = Table(
        Column("child", no_wrap=True, min_width=36), "node", "try", "workflow", "status",
        "error", box=None, title=title, title_justify="left",
    )  # fmt: skip
    for c in view["children"]:
        node = c["node"] if c["item_index"] is None else f"{c['node']}[{c['item_index']}]"
        table.add_row(
            c["id"], node, str(c["try_number"]), f"{c['workflow']} v{c['version']}",
            styled(c["status"]), Text(short(c["error"] or "", 50), style="red"),
        )  # fmt: skip
    return table


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
