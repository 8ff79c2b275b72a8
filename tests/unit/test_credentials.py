"""API keys and webhook signatures: what verifies, and that every malformed input is a
SignatureError (never another exception, which would be a 500)."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta

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
from conveyor.exceptions import AuthError, SignatureError

BODY = json.dumps({"type": "invoice.paid", "data": {"id": 7}}).encode()


def standard_headers(secret: str, body: bytes = BODY, at: datetime | None = None) -> dict:
    at = at or datetime.now(UTC)
    signature = Webhook(secret).sign("msg_1", at, body.decode())
    return {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


def github_headers(secret: str, body: bytes = BODY) -> dict:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "X-Hub-Signature-256": f"sha256={digest}",
        "X-GitHub-Delivery": "d-1",
        "X-GitHub-Event": "push",
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
    verified = verify(SignatureScheme.GITHUB, "s3cret", BODY, github_headers("s3cret"))

    assert (verified.delivery_id, verified.event) == ("d-1", "push")
    with pytest.raises(SignatureError, match="no signature matches"):
        verify(SignatureScheme.GITHUB, "s3cret", BODY, github_headers("other"))
    with pytest.raises(SignatureError, match="unsigned delivery"):
        verify(SignatureScheme.GITHUB, "s3cret", BODY, {"X-GitHub-Delivery": "d"})


def test_a_body_that_is_not_json_is_kept_as_text() -> None:
    body = b"a=1&b=2"

    verified = verify(SignatureScheme.GITHUB, "k", body, github_headers("k", body))

    assert verified.payload == "a=1&b=2"
