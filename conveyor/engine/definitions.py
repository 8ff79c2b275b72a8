"""Workflow definitions: data (YAML or JSON, stored as JSON) with a Python API beside it.

The pydantic models here are both the file format and the Python API::

    Workflow(name="greet", nodes=[
        Node(id="hello", type="python", config={"function": "say_hello"}),
        Node(id="done", type="python", needs=["hello"], config={"function": "log"},
             inputs={"text": "{{ nodes.hello.greeting }}"}),
    ])

Structure is checked here; cross-node rules (duplicates, cycles, missing needs) live in
:mod:`conveyor.engine.validation`, which reports every problem at once.
"""

from __future__ import annotations

import hashlib
import json
import re
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from conveyor.engine import templates
from conveyor.engine.cron import MisfirePolicy, expression_problem, timezone_problem
from conveyor.engine.states import Priority


class RetryPolicy(BaseModel):
    """How often a node is tried and how long to wait between tries.

    The wait before try ``n+1`` is ``backoff * factor**(n-1)``, capped at ``max_backoff``,
    then spread by up to ``jitter`` (a fraction) either way.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(default=3, ge=1, le=100)
    backoff: float = Field(default=1.0, gt=0, le=86_400)
    factor: float = Field(default=2.0, ge=1, le=10)
    max_backoff: float = Field(default=300.0, gt=0, le=7 * 86_400)
    jitter: float = Field(default=0.1, ge=0, le=1)


class Defaults(BaseModel):
    """Policies every node inherits unless it sets its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    timeout: float | None = Field(default=300.0, gt=0, le=86_400)


class ItemFailure(StrEnum):
    """What a map does when one of its items fails (after its own tries)."""

    FAIL_FAST = "fail_fast"  # the node fails at once, its items not started cancelled
    RUN_ALL = "run_all"  # every item runs; the node then fails, listing the failed indices
    CONTINUE = "continue"  # the node completes, a failed item's slot {"error": "..."}


class MapSpec(BaseModel):
    """A run-time fan-out: the node runs once per item of the list ``over`` gives, each item
    a job of its own; its output is the list of the items' outputs, in item order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    over: str = Field(
        min_length=1, description="A template giving the list, e.g. '{{ nodes.fetch.items }}'."
    )
    concurrency: int | None = Field(
        default=None, ge=1, le=100_000, description="Items that may run at once (default: any)."
    )
    on_item_failure: ItemFailure = ItemFailure.FAIL_FAST
    max_items: int | None = Field(
        default=None,
        ge=1,
        description="The longest list the map runs; a longer one fails the node (default "
        "and ceiling: CONVEYOR_MAP_MAX_ITEMS).",
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Left out when not set: maps stored before it existed keep their digest.
        data = handler(self)
        if isinstance(data, dict) and data.get("max_items") is None:
            data.pop("max_items", None)
        return data


class Node(BaseModel):
    """One unit of work in the DAG."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")
    type: str  # the name of a registered type (conveyor.engine.node_types)
    needs: list[str] = Field(default_factory=list)
    inputs: dict[str, Any] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    retry: RetryPolicy | None = None
    timeout: float | None = Field(default=None, gt=0, le=86_400)
    continue_on_failure: bool = False
    # Snoozes in a row (conveyor.Snooze) before the node fails; None: DEFAULT_MAX_SNOOZES.
    max_snoozes: int | None = Field(default=None, ge=0, le=10_000)
    # A run-time fan-out over a list (conveyor.engine.mapping); None: the node runs once.
    map: MapSpec | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Left out when not set: definitions stored before they existed keep their digest.
        data = handler(self)
        if isinstance(data, dict):
            for key in ("max_snoozes", "map"):
                if data.get(key) is None:
                    data.pop(key, None)
        return data

    @cached_property
    def item_reads(self) -> tuple[str, ...]:
        """The needs whose outputs an item of this map reads: those its inputs and config
        name (``over`` is read once, by the node's own job). Not a field."""
        named = templates.referenced_nodes([self.inputs, self.config])
        return tuple(sorted(named & set(self.needs)))

    @cached_property
    def item_reads_input(self) -> bool:
        """Whether an item of this map reads the execution's input (its inputs or config
        name ``input``). An item's claim reads the input only then: a map over a list in the
        input would otherwise read the whole list again for each of its items. Not a field."""
        return templates.may_read([self.inputs, self.config], "input")

    @property
    def snooze_bound(self) -> int:
        return DEFAULT_MAX_SNOOZES if self.max_snoozes is None else self.max_snoozes


# How many times in a row a node may snooze when its definition does not say.
DEFAULT_MAX_SNOOZES = 100


class ScheduleSpec(BaseModel):
    """A cron schedule that starts the workflow; see docs/schedules.md."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Unique within the tenant; default: the workflow's name.",
    )
    cron: str = Field(description="Five fields (minute hour day month weekday) or @daily etc.")
    timezone: str = Field(default="UTC", description="IANA timezone the expression is read in.")
    input: dict[str, Any] = Field(default_factory=dict)
    priority: Priority | None = None
    misfire: MisfirePolicy = MisfirePolicy.ONCE
    catch_up: int = Field(
        default=10, ge=1, le=1000, description="With misfire 'all': missed runs started at most."
    )

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        if problem := expression_problem(value):
            raise ValueError(problem)
        return " ".join(value.split())

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, value: str) -> str:
        if problem := timezone_problem(value):
            raise ValueError(problem)
        return value


EVENT_TYPE = r"^[A-Za-z0-9_.:/-]+$"


class WebhookTrigger(BaseModel):
    """Deliveries to a webhook endpoint of the tenant start the workflow."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str = Field(min_length=1, max_length=100, description="The endpoint's name.")
    events: list[str] = Field(
        default_factory=list,
        description="Only deliveries of these event types (X-GitHub-Event, or the payload's "
        "'type'); empty: every delivery.",
    )


class DedupePolicy(StrEnum):
    """What a trigger does with its input when an execution with its deduplication key is
    still active (pending or running)."""

    KEEP_FIRST = "keep_first"  # the active execution is returned; the newer input is dropped
    REPLACE = "replace"  # the active one's input is replaced if it has not started, else FOLLOW_UP
    FOLLOW_UP = "follow_up"  # one run with the latest input starts when the active one finishes


class Dedupe(BaseModel):
    """How triggers with the same deduplication key meet."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: DedupePolicy = Field(
        default=DedupePolicy.KEEP_FIRST,
        description="keep_first (default), replace or follow_up: what a newer input for an "
        "active execution with the same deduplication key does.",
    )


# What a workflow's name may be made of (a workflow node names one in config.workflow).
WORKFLOW_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")


class Workflow(BaseModel):
    """A named DAG of nodes; applying a changed one stores a new version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    priority: Priority | None = None
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Node jobs of this workflow that may run at once (default: the setting).",
    )
    defaults: Defaults = Field(default_factory=Defaults)
    nodes: list[Node] = Field(min_length=1)
    output: dict[str, Any] | None = None
    schedules: list[ScheduleSpec] = Field(default_factory=list)
    events: list[Annotated[str, Field(min_length=1, max_length=200, pattern=EVENT_TYPE)]] = Field(
        default_factory=list,
        description="Application event types (POST /v1/events) that start the workflow.",
    )
    webhooks: list[WebhookTrigger] = Field(default_factory=list)
    dedupe: Dedupe = Field(default_factory=Dedupe)

    def schedule_names(self) -> list[str]:
        """Each declared schedule's name; an unnamed one takes the workflow's."""
        return [s.name or self.name for s in self.schedules]

    def node(self, node_id: str) -> Node:
        return self._by_id[node_id]  # KeyError for an unknown id

    @cached_property
    def _by_id(self) -> dict[str, Node]:
        """The nodes by id, built at the first lookup: a join's readiness looks up each of its
        needs, and a scan of the list for each would be quadratic in a wide join. Not a field:
        equality, hashing and dumps ignore it."""
        return {n.id: n for n in self.nodes}

    def retry_for(self, node: Node) -> RetryPolicy:
        return node.retry or self.defaults.retry

    def timeout_for(self, node: Node) -> float | None:
        return node.timeout if node.timeout is not None else self.defaults.timeout

    def canonical_json(self) -> str:
        """The definition as stored: sorted keys, no whitespace, defaults made explicit."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """A hash that changes exactly when the stored definition would."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()
