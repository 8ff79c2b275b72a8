"""API keys, webhook secrets and webhook signatures. Pure: bytes and strings in, values out.

API keys look like ``cvk_<prefix>_<secret>``: the prefix finds the row, the SHA-256 of the
whole key is compared in constant time, and only prefix and digest are stored.

Webhook signatures are checked in constant time (``hmac.compare_digest``, inside the
standardwebhooks library for that scheme), and every malformed header ends as a
:class:`SignatureError`, never as another exception.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from standardwebhooks import Webhook

from conveyor.engine import github_events
from conveyor.engine.states import SignatureScheme
from conveyor.exceptions import AuthError, ConveyorError, EventMismatch, SignatureError

KEY_PREFIX = "cvk_"
TOLERANCE_SECONDS = 300  # a Standard Webhooks timestamp further off than this is refused
MAX_ID = 200  # characters of a delivery id (and of an event type) that are kept
# Integer seconds, as the specification says: the library would take "1795630461.5" (or
# " 1e9", "1_795_630_461") and check the signature of its floor.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


@dataclass(frozen=True, kw_only=True)
class NewKey:
    key: str  # shown once to the operator, never stored
    prefix: str
    digest: str


def new_api_key() -> NewKey:
    prefix = secrets.token_hex(6)
    key = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    return NewKey(key=key, prefix=prefix, digest=key_digest(key))


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_prefix(key: str) -> str:
    """The prefix of a well-formed key, or :class:`AuthError`."""
    parts = key.split("_")
    if len(parts) < 3 or f"{parts[0]}_" != KEY_PREFIX or not parts[1]:
        raise AuthError()
    return parts[1]


def key_matches(key: str, digest: str) -> bool:
    return hmac.compare_digest(key_digest(key), digest)


def new_webhook_secret(scheme: SignatureScheme) -> str:
    raw = secrets.token_bytes(32)
    if scheme is SignatureScheme.STANDARD:
        return "whsec_" + base64.b64encode(raw).decode()
    return raw.hex()


@dataclass(frozen=True, kw_only=True)
class Verified:
    """A delivery whose signature checked out."""

    delivery_id: str
    event: str | None
    payload: Any
    signature: str | None = None  # GitHub's: the body's HMAC in hex, to refuse its replays


def verify(
    scheme: SignatureScheme, secret: str, body: bytes, headers: Mapping[str, str]
) -> Verified:
    """The verified delivery, or :class:`SignatureError` saying what is wrong (never the
    secret, never the body)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    signature = None
    if scheme is SignatureScheme.STANDARD:
        delivery_id = _standard(secret, body, lowered)
        payload = _json(body)
        event = payload.get("type") if isinstance(payload, dict) else None
    else:
        delivery_id, signature = _github(secret, body, lowered)
        payload, event = _json(body), lowered.get("x-github-event")
        wrong = github_events.mismatch(event, payload)
        if wrong is not None:
            raise EventMismatch(
                f"the X-GitHub-Event header does not match the signed body: {wrong} (GitHub's "
                "signature does not cover the header, so the pair is refused)"
            )
    if len(delivery_id) > MAX_ID:
        raise ConveyorError(f"the delivery id is over {MAX_ID} characters; send a shorter one")
    return Verified(
        delivery_id=delivery_id,
        event=event[:MAX_ID] if isinstance(event, str) else None,
        payload=payload,
        signature=signature,
    )


def _standard(secret: str, body: bytes, headers: dict[str, str]) -> str:
    names = ("webhook-id", "webhook-timestamp", "webhook-signature")
    missing = [h for h in names if h not in headers]
    if missing:
        raise SignatureError(f"unsigned delivery: missing header(s) {', '.join(missing)}")
    if not _TIMESTAMP.fullmatch(headers["webhook-timestamp"]):
        raise SignatureError(
            "signature refused: webhook-timestamp must be whole seconds since the epoch "
            "(digits only, as the Standard Webhooks specification says)"
        )
    try:
        Webhook(secret).verify(body, headers, json_parse=False)
    except Exception as exc:  # the library raises several kinds for malformed headers
        raise SignatureError(f"signature refused: {_reason(exc)}") from None
    return headers["webhook-id"]


def _reason(exc: Exception) -> str:
    text = str(exc)
    if text in ("Message timestamp too old", "Message timestamp too new"):
        return f"{text.lower()} (more than {TOLERANCE_SECONDS // 60} minutes off)"
    if text == "No matching signature found":
        return "no signature matches the body"
    return "malformed signature headers"


def _github(secret: str, body: bytes, headers: dict[str, str]) -> tuple[str, str]:
    """The delivery id and the body's HMAC (hex), once the signature matches."""
    signature = headers.get("x-hub-signature-256")
    delivery_id = headers.get("x-github-delivery")
    # GitHub always names the event; without it the body's shape could not be checked
    names = ("X-Hub-Signature-256", "X-GitHub-Delivery", "X-GitHub-Event")
    missing = [name for name in names if not headers.get(name.lower())]
    if not signature or not delivery_id or missing:
        raise SignatureError(f"unsigned delivery: missing header(s) {', '.join(missing)}")
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(f"sha256={digest}".encode(), signature.strip().encode()):
        raise SignatureError("signature refused: no signature matches the body")
    return delivery_id, digest


def _json(body: bytes) -> Any:
    """A JSON body as data; anything else is kept as text."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", errors="replace")
