"""Which priority a job gets, and how waiting raises it. Pure decisions, no I/O.

Order of precedence when an execution is triggered: the priority the caller passed, else the
workflow definition's ``priority:``, else the default of the trigger's source
(:class:`TriggerSource`). Every job of the execution inherits it.

Ageing: a low job that has waited ``CONVEYOR_AGE_LOW_AFTER`` seconds (default five minutes)
is served as normal from then on, so background work never starves behind a steady stream of
normal work; high stays above both. It is applied where jobs wait: in the broker queue by
:meth:`SqlStore.age_queued` (re-published at normal) and among parked jobs by the limiter's
sweep.
"""

from __future__ import annotations

from conveyor.engine.states import Priority, TriggerSource


def choose(explicit: Priority | None, workflow: Priority | None, source: TriggerSource) -> Priority:
    """The priority of a new execution: the caller's, else the workflow's, else the source's."""
    return explicit or workflow or source.priority
