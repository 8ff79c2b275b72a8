"""``POST /webhooks/{endpoint_id}``: a third party's signed delivery in, 202 out at once.

The signature is checked before anything is stored (a bad one counts on the endpoint and is
logged, nothing else); the body may be at most ``CONVEYOR_WEBHOOK_MAX_BYTES``; the verified
delivery is stored and handed to the webhook worker, which starts the workflows it matches.
A delivery id the endpoint received before is a sender's retry (Standard Webhooks and GitHub
retry on anything but a 2xx): it answers 200 with the first delivery's outcome, and starts
nothing.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, HTTPException, Request, Response, status
from starlette.concurrency import run_in_threadpool

from conveyor.api.bodies import check_shape, content_length
from conveyor.api.deps import ServiceDep
from conveyor.api.schemas import Problem, Received
from conveyor.config import get_settings

router = APIRouter(tags=["webhooks"])


async def _body(request: Request, limit: int) -> bytes:
    """The body, or 413 as soon as it is known to be over ``limit`` bytes."""
    declared = content_length(request.scope)
    if declared is not None and declared > limit:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, _too_large(limit))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, _too_large(limit))
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> str:
    return f"the body is over {limit} bytes; send less (CONVEYOR_WEBHOOK_MAX_BYTES)"


@router.post(
    "/webhooks/{endpoint_id}",
    status_code=status.HTTP_202_ACCEPTED,
    responses={
        200: {
            "model": Received,
            "description": "A repeat: this delivery id was received "
            "already; nothing is started again, and the first one's outcome is told",
        },
        401: {"model": Problem, "description": "Missing, malformed, expired or wrong signature"},
        404: {"model": Problem, "description": "No such endpoint"},
        409: {
            "model": Problem,
            "description": "A replay: this GitHub body, signed alike, was "
            "received under another delivery id (CONVEYOR_WEBHOOK_REPLAY_WINDOW_DAYS)",
        },
        413: {"model": Problem, "description": "Body too large"},
    },
)
async def receive(
    endpoint_id: uuid.UUID, request: Request, response: Response, service: ServiceDep
) -> Received:
    """Verify (Standard Webhooks or GitHub's X-Hub-Signature-256), store, and enqueue; a
    repeated delivery id answers 200 with the first delivery's outcome."""
    body = await _body(request, get_settings().webhook_max_bytes)
    await check_shape(body, "the delivery")
    receipt = await run_in_threadpool(
        service.receive_webhook, endpoint_id, body, dict(request.headers)
    )
    if receipt.repeated:
        response.status_code = status.HTTP_200_OK
    made = None if receipt.executions is None else list(receipt.executions)
    return Received(
        delivery_id=receipt.id, status=receipt.status, executions=made, repeated=receipt.repeated
    )
