"""Stored versions of workflows: applying a definition, and loading a version parsed and
planned once per process (a version never changes, so the cache is never stale)."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from datetime import datetime

from conveyor.engine import node_types, planning
from conveyor.engine.definitions import Workflow
from conveyor.engine.ports import Store
from conveyor.engine.records import (
    WorkflowRecord,
)
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import DefinitionError

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
    """Store a new version when the definition changed; (latest version, whether it is new).
    A :class:`DefinitionError` when its workflow nodes would start it again, through the
    workflows the tenant has stored (see :func:`child_cycle`); two such applies take turns
    (:meth:`~conveyor.engine.ports.Catalog.lock_applies`), so that two that would each close
    half of a circle cannot both pass."""
    workflow = parse_workflow(definition)
    tenant_id = store.tenant_id(tenant)
    latest = store.latest_workflow(tenant_id, workflow.name)
    digest = workflow.digest()
    if latest is not None and latest.digest == digest:
        return latest, False
    if _children_of(workflow):  # only a workflow that starts children can close a circle
        store.lock_applies(tenant_id)
    if cycle := child_cycle(store, tenant_id, workflow):
        path = " -> ".join(cycle)
        raise DefinitionError([
            f"workflow: its workflow nodes start {workflow.name!r} again through the "
            f"workflows applied ({path}); workflows may not start each other in a circle: "
            f"remove one of these workflow nodes, or start another workflow"
        ])  # fmt: skip
    definition_json = workflow.model_dump(mode="json")
    return store.add_workflow_version(tenant_id, workflow.name, digest, definition_json, now), True


def child_cycle(store: Store, tenant_id: uuid.UUID, workflow: Workflow) -> list[str] | None:
    """The circle of workflows that ``workflow``'s nodes would start (the latest stored
    versions, or those pinned), were it applied as the tenant's latest version: the names
    from it back to it; None when no workflow it starts, however deep, starts it again.
    Each stored version is read once; a workflow not applied yet starts nothing."""
    seen: set[tuple[str, int | None]] = set()
    paths: list[tuple[Workflow, list[str]]] = [(workflow, [workflow.name])]
    while paths:
        current, path = paths.pop()
        for name, version in _children_of(current):
            if name == workflow.name and (
                version is None or not _stored(store, tenant_id, name, version)
            ):
                return [*path, name]
            if (name, version) in seen:
                continue
            seen.add((name, version))
            found = _stored(store, tenant_id, name, version)
            if found is not None:
                paths.append((load_workflow(store, found.id)[0], [*path, name]))
    return None


def _children_of(workflow: Workflow) -> list[tuple[str, int | None]]:
    """The (workflow, version) each of its workflow nodes starts (version None: the latest)."""
    return [
        (node.config["workflow"], node.config.get("version"))
        for node in workflow.nodes
        if node_types.starts_child(node)
    ]


def _stored(
    store: Store, tenant_id: uuid.UUID, name: str, version: int | None
) -> WorkflowRecord | None:
    if version is None:
        return store.latest_workflow(tenant_id, name)
    return store.workflow_version(tenant_id, name, version)
