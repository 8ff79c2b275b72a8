"""Limits a trigger gives its execution: each node job's maximum attempts and each try's
timeout, overriding the definition's (its defaults and each node's own) for that execution.
Stored with the execution; the retry decision (:mod:`conveyor.engine.failure`) and the node's
run (:attr:`conveyor.engine.claiming.NodeRun.timeout`) read them."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, ValidationError

from conveyor.engine.definitions import Node, RetryPolicy, Workflow
from conveyor.engine.records import Limits
from conveyor.exceptions import TriggerLimitError


class _Given(BaseModel):
    """The bounds of the definition's fields (RetryPolicy.max_attempts, Node.timeout)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_attempts: Annotated[int, *RetryPolicy.model_fields["max_attempts"].metadata] | None = None
    timeout: Annotated[float, *Node.model_fields["timeout"].metadata] | None = None


def checked(max_attempts: int | None = None, timeout: float | None = None) -> Limits | None:
    """The limits given, checked against the definition's bounds (None: none given);
    :class:`TriggerLimitError` naming each one out of bounds."""
    try:
        given = _Given(
            max_attempts=max_attempts,
            timeout=float(timeout) if isinstance(timeout, int) else timeout,
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])} {e['msg'].lower()} (got {e['input']!r})"
            for e in exc.errors()
        )
        raise TriggerLimitError(f"the trigger's limits are out of bounds: {problems}") from None
    return Limits.of(given.max_attempts, given.timeout)


def retry_policy(workflow: Workflow, node: Node, limits: Limits | None) -> RetryPolicy:
    """The node's retry policy, with the trigger's maximum attempts when it gave one."""
    policy = workflow.retry_for(node)
    if limits is None or limits.max_attempts is None:
        return policy
    return policy.model_copy(update={"max_attempts": limits.max_attempts})


def timeout(workflow: Workflow, node: Node, limits: Limits | None) -> float | None:
    """Each try's timeout: the trigger's when it gave one, else the definition's."""
    if limits is not None and limits.timeout is not None:
        return limits.timeout
    return workflow.timeout_for(node)
