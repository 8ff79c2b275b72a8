"""The dashboard's sessions: a signed, HttpOnly, SameSite=Strict cookie that names the tenant
and the API key it signed in with (never the key itself), and a CSRF token per session.

Each cookie is signed with its key's session secret, a random value kept on the key's row in
the database (made at the first sign-in), together with CONVEYOR_UI_SECRET when that is set.
So every API process on the same database reads every other's cookies with no setting at all,
and signing out (which clears the key's secret) ends that key's sessions everywhere, a copied
cookie included. The key's row is read again on each request, so revoking the key ends its
sessions at once too.
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


def new_key_secret() -> str:
    """A key's session secret: what its sessions are signed with, until it signs out."""
    return secrets.token_hex(32)


class Signer:
    """Signs and reads session cookies with the key's session secret (and the process's
    ``CONVEYOR_UI_SECRET``, empty or not), and derives each session's CSRF token."""

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()

    def _mac(self, key_secret: str, purpose: str, data: bytes) -> str:
        signing = self._secret + b"\0" + key_secret.encode()
        digest = hmac.new(signing, purpose.encode() + b"\0" + data, hashlib.sha256)
        return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")

    def open(
        self, tenant_id: uuid.UUID, tenant: str, key_prefix: str, key_secret: str
    ) -> tuple[Session, str]:
        """A new session and its cookie value, signed with the key's session secret."""
        session = Session(
            tenant_id=tenant_id, tenant=tenant, key_prefix=key_prefix,
            nonce=secrets.token_urlsafe(16), expires=int(time.time()) + LIFETIME,
        )  # fmt: skip
        body = json.dumps(
            [str(session.tenant_id), session.tenant, session.key_prefix, session.nonce,
             session.expires], separators=(",", ":"),
        ).encode()  # fmt: skip
        data = base64.urlsafe_b64encode(body).decode().rstrip("=")
        return session, f"{data}.{self._mac(key_secret, 'session', data.encode())}"

    @staticmethod
    def claimed(cookie: str | None) -> Session | None:
        """The session a cookie says it holds, NOT verified: only the key prefix it names, to
        look that key's session secret up for :meth:`read`. None if absent or malformed."""
        if not cookie or "." not in cookie:
            return None
        data = cookie.rsplit(".", 1)[0]
        try:
            raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
            tenant_id, tenant, prefix, nonce, expires = json.loads(raw)
            session = Session(
                tenant_id=uuid.UUID(tenant_id), tenant=str(tenant), key_prefix=str(prefix),
                nonce=str(nonce), expires=int(expires),
            )  # fmt: skip
        except (ValueError, TypeError, AttributeError):  # not yet verified: anything at all
            return None
        return session

    def read(self, cookie: str | None, key_secret: str) -> Session | None:
        """The session a cookie holds, signed with ``key_secret``; None if absent, forged,
        malformed, expired, or signed before the key signed out."""
        session = self.claimed(cookie)
        if cookie is None or session is None:
            return None
        data, mac = cookie.rsplit(".", 1)
        if not _same(mac, self._mac(key_secret, "session", data.encode())):
            return None
        return session if session.expires > time.time() else None

    def csrf(self, session: Session, key_secret: str) -> str:
        """The token every form of this session posts back."""
        return self._mac(key_secret, "csrf", session.nonce.encode())


def csrf_matches(expected: str, token: str | None) -> bool:
    return token is not None and _same(token, expected)


def _same(given: str, expected: str) -> bool:
    """In constant time; a value that is not ASCII (forged: a MAC is) is simply not equal
    (hmac.compare_digest raises on non-ASCII str)."""
    return hmac.compare_digest(given.encode(), expected.encode())
