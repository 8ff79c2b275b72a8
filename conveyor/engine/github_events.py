"""What GitHub's webhook payloads carry, to check the ``X-GitHub-Event`` header against the
signed body. Pure: an event name and a payload in, a reason or None out.

GitHub's ``X-Hub-Signature-256`` covers the body only, not the headers: whoever captured a
delivery can send its body again under another event name. The body, though, has the shape
of the event GitHub sent it for (its documented payloads; the keys below are those GitHub's
own webhook schemas mark required). A body lacking what the named event always carries, or
carrying what only another event carries, is refused. Event names not listed here, and
events whose payloads share one shape, cannot be told apart: docs/security.md says so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

# Top-level keys each event's payload always has.
REQUIRED: Mapping[str, tuple[str, ...]] = {
    "ping": ("zen", "hook_id", "hook"),
    "push": ("ref", "before", "after", "commits", "pusher"),
    "create": ("ref", "ref_type", "master_branch"),
    "delete": ("ref", "ref_type"),
    "pull_request": ("action", "number", "pull_request"),
    "pull_request_review": ("action", "review", "pull_request"),
    "pull_request_review_comment": ("action", "comment", "pull_request"),
    "issues": ("action", "issue"),
    "issue_comment": ("action", "issue", "comment"),
    "release": ("action", "release"),
    "workflow_run": ("action", "workflow_run", "workflow"),
    "workflow_job": ("action", "workflow_job"),
    "check_run": ("action", "check_run"),
    "check_suite": ("action", "check_suite"),
    "deployment_status": ("action", "deployment_status", "deployment"),
    "fork": ("forkee",),
    "star": ("action", "starred_at"),
}

# Top-level keys only these events' payloads have.
ONLY_IN: Mapping[str, frozenset[str]] = {
    "zen": frozenset({"ping"}),
    "head_commit": frozenset({"push"}),
    "master_branch": frozenset({"create"}),
    "forkee": frozenset({"fork"}),
    "comment": frozenset(
        {
            "issue_comment",
            "pull_request_review_comment",
            "commit_comment",
            "discussion_comment",
        }
    ),
}


def mismatch(event: str | None, payload: Any) -> str | None:
    """Why a signed ``payload`` cannot be the ``event`` the header names; None when it can
    be (or when nothing can be told: no event header, a body that is no JSON object)."""
    body = _object(payload)
    if event is None or body is None:
        return None
    missing = [key for key in REQUIRED.get(event, ()) if key not in body]
    if missing:
        return f"a {event!r} payload always has {', '.join(missing)}; this one has not"
    for key, events in ONLY_IN.items():
        if key in body and event not in events:
            return f"only a {' or '.join(sorted(events))} payload has {key!r}; this one does"
    return None


def _object(payload: Any) -> dict[str, Any] | None:
    """The payload as a JSON object: as sent, or from the ``payload`` field of a form body
    (the content type GitHub offers besides JSON)."""
    if isinstance(payload, str) and payload.startswith("payload="):
        try:
            payload = json.loads(parse_qs(payload, max_num_fields=1)["payload"][0])
        except (ValueError, KeyError):
            return None
    return payload if isinstance(payload, dict) else None
