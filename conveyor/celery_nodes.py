"""Existing Celery tasks as python nodes, without rewriting them.

An application allows each task it wants workflows to run, once, in a module listed in
``CONVEYOR_IMPORTS``::

    from myapp.tasks import charge_card      # @app.task(name="billing.charge_card")
    conveyor.celery_task(charge_card)        # a definition may now name billing.charge_card

The task's body then runs as a python node under its Celery name: on a node thread of a
Conveyor worker, its inputs the task's keyword arguments and its return value the node's
output, with the node's tries, timeout, limits and records (not Celery's own retries). Only a
task allowed so can run: a definition cannot name any other task, nor any import path.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol, TypeVar

from conveyor import nodes


class CeleryTask(Protocol):
    """What is used of a Celery task: its name, and calling its body here."""

    name: str

    def run(self, *args: Any, **kwargs: Any) -> Any: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


T = TypeVar("T", bound=CeleryTask)


def celery_task(task: T, *, name: str | None = None) -> T:
    """Allow ``task`` to run as the python node function ``name`` (default: the task's
    Celery name); the task is returned unchanged."""

    def run(**kwargs: Any) -> Any:
        return task(**kwargs)  # Task.__call__ runs the body in this process, not via a broker

    functools.update_wrapper(run, task.run)  # its parameters are the task's
    nodes.node(name or task.name)(run)
    return task
