"""Concurrency limits: which semaphores a node job needs and what the limiter answered.

Three limits bound the node jobs running at once: global, per tenant and per workflow (by
name, across versions). A job runs only while it holds a permit under all three; it gets them
in one atomic step or not at all. A job that cannot get them is *parked*: it gives its worker
slot back and waits, in priority order and round-robin across tenants, until a release (or,
as a safety net, the sweep) wakes it. The adapter is :mod:`conveyor.limiter`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from conveyor.engine.states import Priority

GLOBAL_KEY = "global"

# The limiter's classes: lower is served first.
PRIORITY_CLASS = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}
CLASS_PRIORITY = {v: k for k, v in PRIORITY_CLASS.items()}


def tenant_key(tenant_id: uuid.UUID) -> str:
    return f"tenant:{tenant_id}"


def workflow_key(tenant_id: uuid.UUID, workflow_name: str) -> str:
    return f"workflow:{tenant_id}:{workflow_name}"


@dataclass(frozen=True, kw_only=True)
class Limits:
    """The limits that apply to one job, after overrides."""

    global_: int
    tenant: int
    workflow: int


def resolve(
    defaults: Limits, *, tenant_override: int | None, workflow_override: int | None
) -> Limits:
    """A tenant row and a workflow definition may set their own limit; the settings fill in."""
    return Limits(
        global_=defaults.global_,
        tenant=tenant_override or defaults.tenant,
        workflow=workflow_override or defaults.workflow,
    )


@dataclass(frozen=True, kw_only=True)
class PermitRequest:
    """What a node job asks the limiter for."""

    job_id: uuid.UUID
    tenant_id: uuid.UUID
    workflow_name: str
    priority: Priority
    limits: Limits
    enqueued_at_ms: int
    node_id: str = ""  # kept with the job while it is parked, to name its message when woken

    @property
    def tenant_key(self) -> str:
        return tenant_key(self.tenant_id)

    @property
    def workflow_key(self) -> str:
        return workflow_key(self.tenant_id, self.workflow_name)


@dataclass(frozen=True, kw_only=True)
class Permit:
    """Permits held under all three keys, until released or their lease lapses."""

    token: str
    tenant_key: str
    workflow_key: str


@dataclass(frozen=True, kw_only=True)
class Wake:
    """A parked job the limiter granted permits to: publish it so that a worker runs it."""

    job_id: uuid.UUID
    priority: Priority
    # its workflow and node, kept by the limiter since it was parked: its message's name
    # (empty for a job parked by an older version, which kept none)
    workflow: str = ""
    node: str = ""


def workflow_of(key: str) -> str:
    """The workflow name of a workflow key (see :func:`workflow_key`)."""
    return key.split(":", 2)[2] if key.startswith("workflow:") else ""


@dataclass(frozen=True, kw_only=True)
class Acquired:
    """The answer to a request: a permit, or None when the job was parked; plus the parked
    jobs this call happened to wake, which the caller must publish."""

    permit: Permit | None
    blocked_by: str = ""  # when parked: the key that had no room (or whose line it joined)
    woken: list[Wake] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    aged: int
    lapsed_grants: int
    woken: list[Wake]


@dataclass(frozen=True, kw_only=True)
class KeyUsage:
    """One semaphore as `conveyor limits` shows it."""

    key: str
    in_use: int
    limit: int
    waiting: int

    @property
    def kind(self) -> str:
        return self.key.split(":", 1)[0]

    def name(self, tenant_names: Mapping[str, str]) -> str:
        """What the key limits, by name: a tenant's name, ``tenant/workflow``, or "" for the
        global key (``tenant_names``: tenant id -> name; an id not in it stands for itself)."""
        if self.kind == "tenant":
            tenant_id = self.key.split(":", 1)[1]
            return tenant_names.get(tenant_id, tenant_id)
        if self.kind == "workflow":
            _, tenant_id, workflow = self.key.split(":", 2)
            return f"{tenant_names.get(tenant_id, tenant_id)}/{workflow}"
        return ""
