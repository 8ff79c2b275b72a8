"""Stored versions of workflows: applying a definition, and loading a version parsed and
planned once per process (a version never changes, so the cache is never stale)."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from datetime import datetime

from conveyor.engine import planning
from conveyor.engine.definitions import Workflow
from conveyor.engine.ports import Store
from conveyor.engine.records import (
    WorkflowRecord,
)
from conveyor.engine.validation import parse_workflow

_cache: OrderedDict[uuid.UUID, tuple[Workflow, planning.Plan]] = OrderedDict()
_cache_lock = threading.Lock()


def cached_workflow(workflow_id: uuid.UUID) -> tuple[Workflow, planning.Plan] | None:
    """A stored version this process has parsed already, or None."""
    with _cache_lock:
        return _cache.get(workflow_id)


def load_workflow(store: Store, workflow_id: uuid.UUID) -> tuple[Workflow, planning.Plan]:
    """A stored version, parsed and planned once per process (versions never change)."""
    with _cache_lock:
        if workflow_id in _cache:
            _cache.move_to_end(workflow_id)
            return _cache[workflow_id]
    record = store.workflow(workflow_id)
    workflow = Workflow.model_validate(record.definition)
    entry = (workflow, planning.plan(workflow))
    with _cache_lock:
        _cache[workflow_id] = entry
        while len(_cache) > 512:
            _cache.popitem(last=False)
    return entry


def apply_workflow(
    store: Store, tenant: str, definition: Workflow, now: datetime
) -> tuple[WorkflowRecord, bool]:
    """Store a new version when the definition changed; (latest version, whether it is new)."""
    workflow = parse_workflow(definition)
    tenant_id = store.tenant_id(tenant)
    latest = store.latest_workflow(tenant_id, workflow.name)
    digest = workflow.digest()
    if latest is not None and latest.digest == digest:
        return latest, False
    definition_json = workflow.model_dump(mode="json")
    return store.add_workflow_version(tenant_id, workflow.name, digest, definition_json, now), True
