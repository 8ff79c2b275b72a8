"""The OpenAPI links of the API's schema: which answer names what another operation takes
(``POST /v1/workflows`` answers the name ``POST /v1/workflows/{name}/executions`` takes, a
trigger the id of the execution it made, ...). Clients and generators (schemathesis's stateful
runs) follow them from one call to the next."""

from __future__ import annotations

from typing import Any

Operation = tuple[str, str]  # path, method

_EXECUTION = {
    "ShowExecution": (("/v1/executions/{execution_id}", "get"), "execution_id"),
    "CancelExecution": (("/v1/executions/{execution_id}/cancel", "post"), "execution_id"),
    "RerunExecution": (("/v1/executions/{execution_id}/rerun", "post"), "execution_id"),
    "ExecutionEvents": (("/v1/executions/{execution_id}/events", "get"), "execution_id"),
    "ExecutionChildren": (("/v1/executions/{execution_id}/children", "get"), "execution_id"),
}
_WORKFLOW = {
    "ShowWorkflow": (("/v1/workflows/{name}", "get"), "name"),
    "TriggerWorkflow": (("/v1/workflows/{name}/executions", "post"), "name"),
}
_DEAD_LETTER = {"ShowDeadLetter": (("/v1/dead-letters/{job_id}", "get"), "job_id")}

# (operation, its statuses, where in the answer the value is, the operations taking it)
LINKS: list[tuple[Operation, tuple[str, ...], str, dict[str, tuple[Operation, str]]]] = [
    (("/v1/workflows", "post"), ("201", "200"), "/name", _WORKFLOW),
    (("/v1/workflows", "get"), ("200",), "/0/name", _WORKFLOW),
    (("/v1/workflows/{name}/executions", "post"), ("201", "200"), "/id", _EXECUTION),
    (("/v1/executions", "get"), ("200",), "/0/id", _EXECUTION),
    (("/v1/executions/{execution_id}/children", "get"), ("200",), "/0/id", _EXECUTION),
    (("/v1/events", "post"), ("202",), "/executions/0", _EXECUTION),
    (("/v1/dead-letters", "get"), ("200",), "/0/job_id", _DEAD_LETTER),
]


def add_links(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema, its operations' answers given the links above."""
    paths = schema["paths"]
    for (path, method), statuses, pointer, targets in LINKS:
        responses = paths[path][method]["responses"]
        links = {
            name: {
                "operationId": paths[target_path][target_method]["operationId"],
                "parameters": {parameter: f"$response.body#{pointer}"},
            }
            for name, ((target_path, target_method), parameter) in targets.items()
        }
        for status in statuses:
            responses[status].setdefault("links", {}).update(links)
    return schema
