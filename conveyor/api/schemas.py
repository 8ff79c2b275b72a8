"""Request and response bodies of the REST API (the JSON shapes of executions and workflows
are :mod:`conveyor.views`, shared with the CLI)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from conveyor.engine.definitions import EVENT_TYPE
from conveyor.engine.states import DeliveryStatus, Priority


class Problem(BaseModel):
    """What went wrong and how to fix it."""

    detail: str
    errors: list[str] = Field(default_factory=list)


class Applied(BaseModel):
    name: str
    version: int
    stored: bool  # False: the definition was unchanged, no new version


class TriggerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: dict[str, Any] = Field(default_factory=dict)
    priority: Priority | None = None
    dedupe_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="While an execution with this key is pending or running, return it.",
    )
    run_at: datetime | None = Field(
        default=None,
        description="Start then (ISO 8601 with a UTC offset); the execution waits, pending.",
    )
    delay: float | None = Field(
        default=None, description="Start this many seconds from now (not with run_at)."
    )
    max_attempts: int | None = Field(
        default=None,
        description="Tries of each node job (1-100), overriding the definition's for this run.",
    )
    timeout: float | None = Field(
        default=None,
        description="Seconds each try may run (at most 86400), overriding the definition's.",
    )


class Started(BaseModel):
    id: uuid.UUID
    replayed: bool  # an earlier call with the same Idempotency-Key (or dedupe key) made it
    dedupe: str | None = Field(
        default=None,
        description="With a dedupe_key active on another execution, what the workflow's "
        "dedupe policy did with this input: deduplicated (dropped), replaced (the active "
        "execution, not started yet, runs with it) or follow_up (it runs once the active "
        "one finishes); null when the key was not active.",
    )


class Cancelled(BaseModel):
    id: uuid.UUID
    status: str


class RerunBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_node: str = Field(
        min_length=1,
        max_length=100,
        description="The node to run again, with every node downstream of it.",
    )
    input: dict[str, Any] | None = Field(
        default=None,
        description="Given to that node in place of its rendered inputs (its inputs by name); "
        "null: its templates, rendered as before.",
    )


class Rerun(BaseModel):
    id: uuid.UUID
    status: str  # running
    from_node: str
    nodes: list[str] = Field(description="Every node that runs again, in definition order.")
    queued: list[str] = Field(description="Those of them queued now (the others wait).")


class EventBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = Field(min_length=1, max_length=200, pattern=EVENT_TYPE)
    payload: dict[str, Any] = Field(default_factory=dict)
    run_at: datetime | None = Field(
        default=None,
        description="Start its executions then (ISO 8601 with a UTC offset); they wait, pending.",
    )
    delay: float | None = Field(
        default=None, description="Start them this many seconds from now (not with run_at)."
    )
    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="The correlation key: wakes every wait node of the tenant waiting for "
        "this type and key (its output: the payload), and is kept for the waits that begin "
        "later (CONVEYOR_EVENT_RETENTION_SECONDS). Without it, the event wakes no wait.",
    )


class EventStarted(BaseModel):
    executions: list[uuid.UUID]
    woke: list[uuid.UUID] = Field(
        default_factory=list, description="The executions whose wait nodes the event woke."
    )


class Received(BaseModel):
    """A delivery accepted (202), or a repeat of one (200: the same delivery id again, which
    starts nothing and is told how the first one went)."""

    delivery_id: uuid.UUID  # the delivery's id here (not the sender's)
    status: DeliveryStatus  # received: not handled yet; processed; unmatched
    executions: list[uuid.UUID] | None  # those it started (null: not recorded then)
    repeated: bool  # the endpoint had received this delivery id before


class JobIds(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_ids: list[uuid.UUID] = Field(min_length=1, max_length=1000)


class RequeueBody(JobIds):
    run_at: datetime | None = Field(
        default=None,
        description="Resume then (ISO 8601 with a UTC offset); the jobs wait until then.",
    )
    delay: float | None = Field(
        default=None, description="Resume this many seconds from now (not with run_at)."
    )


class Outcomes(BaseModel):
    done: list[uuid.UUID]  # requeued, or discarded
    refused: dict[str, str]  # job id -> why
