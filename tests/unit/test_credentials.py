"""API keys and webhook signatures: what verifies, and that every malformed input is a
SignatureError (never another exception, which would be a 500)."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from urllib.parse import quote_plus

import pytest
from standardwebhooks import Webhook

from conveyor.engine.credentials import (
    key_matches,
    key_prefix,
    new_api_key,
    new_webhook_secret,
    verify,
)
from conveyor.engine.states import SignatureScheme
from conveyor.exceptions import AuthError, EventMismatch, SignatureError

BODY = json.dumps({"type": "invoice.paid", "data": {"id": 7}}).encode()
PUSH = json.dumps(
    {"ref": "refs/heads/main", "before": "a1", "after": "b2", "commits": [], "pusher": {}}
).encode()
PING = json.dumps({"zen": "Keep it logically awesome.", "hook_id": 7, "hook": {}}).encode()


def standard_headers(secret: str, body: bytes = BODY, at: datetime | None = None) -> dict:
    at = at or datetime.now(UTC)
    signature = Webhook(secret).sign("msg_1", at, body.decode())
    return {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


def github_headers(secret: str, body: bytes = PUSH, event: str = "push") -> dict:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "X-Hub-Signature-256": f"sha256={digest}",
        "X-GitHub-Delivery": "d-1",
        "X-GitHub-Event": event,
    }


def test_a_new_key_matches_its_digest_and_no_other_key() -> None:
    made, other = new_api_key(), new_api_key()

    assert key_prefix(made.key) == made.prefix
    assert key_matches(made.key, made.digest)
    assert not key_matches(other.key, made.digest)
    assert made.key not in made.digest


@pytest.mark.parametrize("key", ["", "Bearer", "cvk_", "cvk__x", "abc_def_ghi", "cvk"])
def test_a_malformed_key_is_an_auth_error(key: str) -> None:
    with pytest.raises(AuthError, match="send `Authorization: Bearer <key>`"):
        key_prefix(key)


def test_a_standard_webhook_signed_by_the_library_verifies() -> None:
    secret = new_webhook_secret(SignatureScheme.STANDARD)

    verified = verify(SignatureScheme.STANDARD, secret, BODY, standard_headers(secret))

    assert (verified.delivery_id, verified.event) == ("msg_1", "invoice.paid")
    assert verified.payload == {"type": "invoice.paid", "data": {"id": 7}}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"body": BODY.replace(b"7", b"8")}, "no signature matches the body"),
        ({"shift": timedelta(minutes=-6)}, "timestamp too old"),
        ({"shift": timedelta(minutes=6)}, "timestamp too new"),
        ({"secret": new_webhook_secret(SignatureScheme.STANDARD)}, "no signature matches"),
    ],
)
def test_a_tampered_expired_or_foreign_standard_webhook_is_refused(change: dict, says: str) -> None:
    secret = new_webhook_secret(SignatureScheme.STANDARD)
    at = datetime.now(UTC) + change.get("shift", timedelta(0))  # now: when the test runs
    headers = standard_headers(change.get("secret", secret), at=at)

    with pytest.raises(SignatureError, match=says):
        verify(SignatureScheme.STANDARD, secret, change.get("body", BODY), headers)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"webhook-id": "m", "webhook-timestamp": "1"},
        {"webhook-id": "m", "webhook-timestamp": "soon", "webhook-signature": "v1,AAAA"},
        {"webhook-id": "m", "webhook-timestamp": "NaN", "webhook-signature": "v1,AAAA"},
        {"webhook-id": "m", "webhook-timestamp": "1e400", "webhook-signature": "v1,AAAA"},
        {"webhook-id": "m", "webhook-signature": "garbage"},
        {"webhook-id": "m", "webhook-signature": "v1,@@not-base64@@"},
    ],
)  # fmt: skip
def test_malformed_standard_headers_are_a_signature_error(headers: dict) -> None:
    secret = new_webhook_secret(SignatureScheme.STANDARD)
    if "webhook-signature" in headers and "webhook-timestamp" not in headers:
        headers = {**headers, "webhook-timestamp": str(int(datetime.now(UTC).timestamp()))}

    with pytest.raises(SignatureError):
        verify(SignatureScheme.STANDARD, secret, BODY, headers)


def test_a_github_webhook_verifies_and_a_wrong_one_is_refused() -> None:
    verified = verify(SignatureScheme.GITHUB, "s3cret", PUSH, github_headers("s3cret"))

    assert (verified.delivery_id, verified.event) == ("d-1", "push")
    assert verified.signature == hmac.new(b"s3cret", PUSH, hashlib.sha256).hexdigest()
    with pytest.raises(SignatureError, match="no signature matches"):
        verify(SignatureScheme.GITHUB, "s3cret", PUSH, github_headers("other"))
    with pytest.raises(SignatureError, match="unsigned delivery"):
        verify(SignatureScheme.GITHUB, "s3cret", PUSH, {"X-GitHub-Delivery": "d"})


def test_a_body_that_is_not_json_is_kept_as_text() -> None:
    body = b"a=1&b=2"

    verified = verify(SignatureScheme.GITHUB, "k", body, github_headers("k", body))

    assert verified.payload == "a=1&b=2"


def test_a_standard_webhook_carries_no_signature_to_deduplicate_by() -> None:
    # its signature covers the delivery id and the timestamp: a new id cannot reuse it
    secret = new_webhook_secret(SignatureScheme.STANDARD)

    verified = verify(SignatureScheme.STANDARD, secret, BODY, standard_headers(secret))

    assert verified.signature is None


@pytest.mark.parametrize(
    "timestamp",
    ["{now}.5", "{now}.0", " {now}", "{now} ", "+{now}", "{now}e0", "0x6b04e6fd", "1_795_630_461",
     "\u0661\u0662", "-{now}", "", "99999999999999999999"],
)  # fmt: skip
def test_a_standard_timestamp_that_is_not_whole_seconds_is_refused_before_the_signature(
    timestamp: str,
) -> None:
    # Given a delivery signed right for the whole second (the library floors a fraction)
    secret = new_webhook_secret(SignatureScheme.STANDARD)
    headers = standard_headers(secret)
    now = headers["webhook-timestamp"]
    headers["webhook-timestamp"] = timestamp.format(now=now).encode().decode("unicode_escape")

    with pytest.raises(SignatureError, match="whole seconds since the epoch"):
        verify(SignatureScheme.STANDARD, secret, BODY, headers)


def test_a_signed_ping_sent_again_as_a_push_is_refused() -> None:
    headers = github_headers("k", PING, event="push")

    with pytest.raises(EventMismatch, match="'push' payload always has ref, before, after"):
        verify(SignatureScheme.GITHUB, "k", PING, headers)
    assert verify(SignatureScheme.GITHUB, "k", PING, github_headers("k", PING, "ping")).event == (
        "ping"
    )


def test_a_signed_push_sent_again_as_another_event_is_refused() -> None:
    for event in ("ping", "create", "pull_request", "issues"):
        with pytest.raises(EventMismatch, match="X-GitHub-Event header does not match"):
            verify(SignatureScheme.GITHUB, "k", PUSH, github_headers("k", PUSH, event))


def test_a_form_encoded_github_body_is_checked_against_its_event_too() -> None:
    body = b"payload=" + quote_plus(PING.decode()).encode()

    with pytest.raises(EventMismatch):
        verify(SignatureScheme.GITHUB, "k", body, github_headers("k", body, "push"))
    assert verify(SignatureScheme.GITHUB, "k", body, github_headers("k", body, "ping")).payload


def test_a_github_delivery_without_its_event_header_is_refused() -> None:
    # GitHub always sends it: without it, the signed body's shape could not be checked
    headers = {k: v for k, v in github_headers("k").items() if k != "X-GitHub-Event"}

    with pytest.raises(SignatureError, match=r"missing header\(s\) X-GitHub-Event"):
        verify(SignatureScheme.GITHUB, "k", PUSH, headers)
