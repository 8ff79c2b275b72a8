"""The dashboard's sessions: a signed, HttpOnly, SameSite=Strict cookie that names the tenant
and the API key it signed in with (never the key itself), and a CSRF token per session.

Stateless, so that any API process sharing CONVEYOR_UI_SECRET serves it; the key's prefix is
looked up again on each request, so a revoked key ends its sessions at once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid
from dataclasses import dataclass

COOKIE = "conveyor_ui"
LIFETIME = 12 * 3600  # seconds a session lasts after sign-in


@dataclass(frozen=True, kw_only=True)
class Session:
    tenant_id: uuid.UUID
    tenant: str
    key_prefix: str
    nonce: str  # random, per sign-in: the CSRF token derives from it
    expires: int  # Unix seconds


class Signer:
    """Signs and reads session cookies, and derives each session's CSRF token."""

    def __init__(self, secret: str) -> None:
        self._secret = (secret or secrets.token_hex(32)).encode()

    def _mac(self, purpose: str, data: bytes) -> str:
        digest = hmac.new(self._secret, purpose.encode() + b"\0" + data, hashlib.sha256)
        return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")

    def open(self, tenant_id: uuid.UUID, tenant: str, key_prefix: str) -> tuple[Session, str]:
        """A new session and its cookie value."""
        session = Session(
            tenant_id=tenant_id, tenant=tenant, key_prefix=key_prefix,
            nonce=secrets.token_urlsafe(16), expires=int(time.time()) + LIFETIME,
        )  # fmt: skip
        body = json.dumps(
            [str(session.tenant_id), session.tenant, session.key_prefix, session.nonce,
             session.expires], separators=(",", ":"),
        ).encode()  # fmt: skip
        data = base64.urlsafe_b64encode(body).decode().rstrip("=")
        return session, f"{data}.{self._mac('session', data.encode())}"

    def read(self, cookie: str | None) -> Session | None:
        """The session a cookie holds; None if absent, forged, malformed or expired."""
        if not cookie or "." not in cookie:
            return None
        data, mac = cookie.rsplit(".", 1)
        if not _same(mac, self._mac("session", data.encode())):
            return None
        try:
            raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
            tenant_id, tenant, prefix, nonce, expires = json.loads(raw)
            session = Session(
                tenant_id=uuid.UUID(tenant_id), tenant=str(tenant), key_prefix=str(prefix),
                nonce=str(nonce), expires=int(expires),
            )  # fmt: skip
        except ValueError:
            return None
        return session if session.expires > time.time() else None

    def csrf(self, session: Session) -> str:
        """The token every form of this session posts back."""
        return self._mac("csrf", session.nonce.encode())

    def csrf_matches(self, session: Session, token: str | None) -> bool:
        return token is not None and _same(token, self.csrf(session))


def _same(given: str, expected: str) -> bool:
    """In constant time; a value that is not ASCII (forged: a MAC is) is simply not equal
    (hmac.compare_digest raises on non-ASCII str)."""
    return hmac.compare_digest(given.encode(), expected.encode())
