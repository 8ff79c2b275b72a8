"""Which priority a job gets, and how waiting raises it. Pure decisions, no I/O.

Order of precedence when an execution is triggered: the priority the caller passed, else the
workflow definition's ``priority:``, else the default of the trigger's source
(:class:`TriggerSource`). Every job of the execution inherits it.

Ageing: a low job that has waited ``age_after`` seconds (default five minutes) is served as
normal from then on, so background work never starves behind a steady stream of normal work.
High stays above both: an aged low job never overtakes high work.
"""

from __future__ import annotations

from conveyor.engine.states import Priority, TriggerSource


def choose(explicit: Priority | None, workflow: Priority | None, source: TriggerSource) -> Priority:
    """The priority of a new execution: the caller's, else the workflow's, else the source's."""
    return explicit or workflow or source.priority


def aged(priority: Priority, waited: float, age_after: float) -> Priority:
    """The priority a job waiting ``waited`` seconds is served at."""
    if priority is Priority.LOW and waited >= age_after:
        return Priority.NORMAL
    return priority
