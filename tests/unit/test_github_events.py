"""The check of X-GitHub-Event against the signed body (conveyor.engine.github_events)."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.engine.github_events import mismatch

PING = {"zen": "Design for failure.", "hook_id": 1, "hook": {}, "repository": {}}
PUSH = {
    "ref": "refs/heads/main", "before": "0" * 40, "after": "1" * 40, "commits": [],
    "head_commit": None, "pusher": {"name": "octocat"}, "forced": False,
}  # fmt: skip
CREATE = {"ref": "v1", "ref_type": "tag", "master_branch": "main", "pusher_type": "user"}
DELETE = {"ref": "v1", "ref_type": "tag", "pusher_type": "user"}
PR = {"action": "opened", "number": 3, "pull_request": {}}
ISSUE_COMMENT = {"action": "created", "issue": {}, "comment": {}}


@pytest.mark.parametrize(
    ("event", "payload"),
    [("ping", PING), ("push", PUSH), ("create", CREATE), ("delete", DELETE),
     ("pull_request", PR), ("issue_comment", ISSUE_COMMENT)],
)  # fmt: skip
def test_each_documented_payload_matches_its_own_event(event: str, payload: Any) -> None:
    assert mismatch(event, payload) is None


@pytest.mark.parametrize(
    ("event", "payload", "says"),
    [
        ("push", PING, "a 'push' payload always has ref, before, after, commits, pusher"),
        ("ping", PUSH, "a 'ping' payload always has zen, hook_id, hook"),
        ("create", DELETE, "always has master_branch"),
        ("delete", CREATE, "only a create payload has 'master_branch'"),
        ("issues", ISSUE_COMMENT, "only a commit_comment or discussion_comment or"),
        ("pull_request", PUSH, "always has action, number, pull_request"),
        ("repository", PING, "only a ping payload has 'zen'"),
    ],
)
def test_a_payload_sent_under_another_events_name_is_told_apart(
    event: str, payload: Any, says: str
) -> None:
    assert says in (mismatch(event, payload) or "")


def test_an_event_github_payloads_do_not_tell_apart_passes_but_a_telltale_key_does_not() -> None:
    # an event not listed passes, unless its body carries what only another event has
    assert mismatch("gollum", {"pages": []}) is None
    assert mismatch("gollum", PING) is not None


@pytest.mark.parametrize("payload", ["not json", ["a list"], 7, None, "payload=%7Bbroken"])
def test_a_body_that_is_no_json_object_cannot_be_checked(payload: Any) -> None:
    assert mismatch("push", payload) is None


def test_no_event_header_is_not_checked() -> None:
    assert mismatch(None, PING) is None
