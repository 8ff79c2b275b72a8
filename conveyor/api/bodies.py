"""The bounds of ``/v1`` request bodies, met before anything parses them.

An ASGI middleware hands each ``/v1`` route its body in one piece, read against the route's
byte bound: a ``Content-Length`` over it answers 413 before a byte is read, and a streamed
body is refused at the chunk that passes it. A body that opens more brackets than
``CONVEYOR_MAX_JSON_DEPTH`` is measured before FastAPI parses it: one nested deeper answers
422, and so does a NaN or Infinity (Python's parser takes them, JSON has none). Each answer
names the bound and its setting. (The webhook receiver, outside ``/v1``, reads its own body
against ``CONVEYOR_WEBHOOK_MAX_BYTES``.)
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from fastapi import HTTPException, status
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.config import get_settings
from conveyor.engine import bounds
from conveyor.engine.bounds import Bounds

# The few /v1 bodies that carry a caller's data, by route; every other /v1 body (a list of
# dead letters' ids: 1,000 at most) is held to OTHER_BODY_BYTES.
_ROUTES: dict[str, tuple[str, str, str]] = {
    "/v1/workflows": ("the definition", "definition_bytes", "CONVEYOR_MAX_DEFINITION_BYTES"),
    "/v1/workflows/{name}/executions": (
        "the trigger's body",
        "input_bytes",
        "CONVEYOR_MAX_INPUT_BYTES",
    ),
    "/v1/events": ("the event's body", "event_bytes", "CONVEYOR_MAX_EVENT_BYTES"),
    "/v1/executions/{execution_id}/rerun": (
        "the rerun's body",
        "input_bytes",
        "CONVEYOR_MAX_INPUT_BYTES",
    ),
}
OTHER_BODY_BYTES = 65_536
# A GET's body is never read as one (a stream's wait for the client's disconnect calls
# receive, and must not be refused).
_WITH_BODY = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class BodyBounds:
    """The middleware: every ``/v1`` body within its route's bounds, or 413/422."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in _WITH_BODY
            or not scope["path"].startswith("/v1/")
        ):
            await self.app(scope, receive, send)
            return
        await self.app(scope, _Reader(scope, receive).receive, send)


class _Reader:
    """The request's ``receive``: the first call returns the whole body, checked. The route
    is known by then (routing comes before the body is read), and so is its bound."""

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.scope, self._receive, self.read = scope, receive, False

    async def receive(self) -> Message:
        if self.read:
            return await self._receive()
        self.read = True
        settings = get_settings().bounds
        what, limit, setting = _bound(self.scope, settings)
        declared = content_length(self.scope)
        if declared is not None and declared > limit:
            raise _refused(413, bounds.too_large(what, declared, limit, setting))
        chunks, size = [], 0
        while True:
            message = await self._receive()
            if message["type"] != "http.request":
                return message  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _refused(413, bounds.too_large(what, None, limit, setting))
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        await check_shape(body, what)
        return {"type": "http.request", "body": body, "more_body": False}


def _bound(scope: Scope, settings: Bounds) -> tuple[str, int, str | None]:
    """What the body is, its byte bound and the setting that holds it (None: fixed)."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if path in _ROUTES:
        what, field, setting = _ROUTES[path]
        return what, int(getattr(settings, field)), setting
    return "the body", OTHER_BODY_BYTES, None


def content_length(scope: Scope) -> int | None:
    """The request's declared length, or None (absent, or not a number)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            if not value.isdigit():
                return None
            return int(value) if len(value) < 19 else 10**19  # int() refuses 4,300 digits
    return None


def _refused(code: int, detail: str) -> HTTPException:
    # An HTTPException: FastAPI passes one raised while it reads the body on to its handler
    # (any other error there becomes its own 400).
    return HTTPException(
        status.HTTP_413_CONTENT_TOO_LARGE if code == 413 else status.HTTP_422_UNPROCESSABLE_CONTENT,
        detail,
    )


async def check_shape(body: bytes, what: str) -> None:
    """422 for a JSON body nested past CONVEYOR_MAX_JSON_DEPTH or holding NaN/Infinity."""
    if problem := await _shape_problem(body, what, get_settings().max_json_depth):
        raise _refused(422, problem)


async def _shape_problem(body: bytes, what: str, limit: int) -> str | None:
    """Why a JSON body cannot be taken (nested past ``limit``; or a NaN, an Infinity or a
    number too large for a float, which JSON has not and the database refuses), or None. A
    large body is looked at off the event loop."""
    if len(body) <= _INLINE_BYTES:
        return _problem(body, what, limit)
    return await run_in_threadpool(_problem, body, what, limit)


_INLINE_BYTES = 65_536
# A number Python reads as infinite: an exponent of three digits or more (1e400), or more
# digits than a float's largest (1.8e308) has. The lookbehind starts a run's count at its first
# digit only, so the search is linear however the digits are laid out.
_OVERFLOWING = re.compile(rb"[eE]\+?\d{3}|(?<!\d)\d{309}")


def _problem(body: bytes, what: str, limit: int) -> str | None:
    """Most bodies open fewer brackets than ``limit`` and hold no such word or number, and are
    not parsed here; the others are parsed and measured. A body that does not parse is left
    to FastAPI (422)."""
    if (
        body.count(b"[") + body.count(b"{") <= limit
        and b"NaN" not in body
        and b"Infinity" not in body
        and not _OVERFLOWING.search(body)
    ):
        return None
    return _parsed_problem(body, what, limit)


class _NotJson(ValueError):
    """A value Python's json reads and JSON has not (the message says which)."""


def _not_json(constant: str) -> Any:
    raise _NotJson(f"{constant}, which is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        shown = text if len(text) <= 24 else f"{text[:20]}…"
        raise _NotJson(f"the number {shown}, larger than a float holds (about 1.8e308)")
    return value


def _parsed_problem(body: bytes, what: str, limit: int) -> str | None:
    try:
        value: Any = json.loads(body, parse_constant=_not_json, parse_float=_finite)
    except RecursionError:  # deeper than the interpreter's recursion limit, far past ours
        return bounds.too_deep(what, limit)
    except _NotJson as exc:
        return f"{what} holds {exc}; send a finite number or null"
    except ValueError:
        return None
    return bounds.too_deep(what, limit) if bounds.deeper_than(value, limit) else None
