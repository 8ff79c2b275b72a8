"""``POST /webhooks/{endpoint_id}``: a third party's signed delivery in, 202 out at once.

The signature is checked before anything is stored (a bad one counts on the endpoint and is
logged, nothing else); the body may be at most ``CONVEYOR_WEBHOOK_MAX_BYTES``; the verified
delivery is stored and handed to the webhook worker, which starts the workflows it matches.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, HTTPException, Request, status
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
        401: {"model": Problem, "description": "Missing, malformed, expired or wrong signature"},
        404: {"model": Problem, "description": "No such endpoint"},
        409: {"model": Problem, "description": "A delivery with this id was received already"},
        413: {"model": Problem, "description": "Body too large"},
    },
)
async def receive(endpoint_id: uuid.UUID, request: Request, service: ServiceDep) -> Received:
    """Verify (Standard Webhooks or GitHub's X-Hub-Signature-256), store, and enqueue."""
    body = await _body(request, get_settings().webhook_max_bytes)
    await check_shape(body, "the delivery")
    delivery_id = await run_in_threadpool(
        service.receive_webhook, endpoint_id, body, dict(request.headers)
    )
    return Received(delivery_id=delivery_id)
