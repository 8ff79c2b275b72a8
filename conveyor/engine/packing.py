"""Packing: which node jobs published together share a message, and so travel in few (pure).

A broker message costs a worker more than a small node does: the consumer's receive, the
hand-over to a pool process, task events and the ack cost about as much CPU as the claim, the
node and its outcome together (docs/benchmarks.md: what a node costs). So the node jobs one
settle makes ready (a fan-out's members, a workflow's roots, a batch of due retries) are packed
into messages of up to ``most`` jobs each, and the worker runs a message's jobs one after
another, each exactly as if it had come alone: its own permits, claim, try and outcome. Nothing
about a job changes, only how many of them one message names.

Packing must not cost a slow node's siblings their parallelism: the worker hands back the
jobs of its message that it has not started once the message has run for its budget (see
:class:`conveyor.batches.BatchRun`, which runs a batch on the worker), each then published
on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.engine.records import Dispatch
from conveyor.engine.states import JobKind


def batchable(dispatch: Dispatch) -> bool:
    """A node job whose message carries hints (its admission reads nothing): only those are
    packed. A start job, a webhook delivery, or a job published without hints goes alone."""
    return dispatch.kind is JobKind.NODE and dispatch.hints is not None


def pack(dispatches: Sequence[Dispatch], most: int) -> list[list[Dispatch]]:
    """The messages for ``dispatches``: batchable ones of the same queue and priority in
    groups of at most ``most`` (sizes as even as can be, in the order given), the others one
    a message. ``most`` <= 1 packs nothing. Messages come in the order of their first job."""
    if most <= 1 or len(dispatches) < 2:
        return [[d] for d in dispatches]
    lines: dict[tuple[str, str], list[Dispatch]] = {}
    order: list[tuple[str, str] | int] = []
    for i, d in enumerate(dispatches):
        if not batchable(d):
            order.append(i)
            continue
        line = (d.queue, d.priority.value)
        if line not in lines:
            lines[line] = []
            order.append(line)
        lines[line].append(d)
    messages: list[list[Dispatch]] = []
    for entry in order:
        if isinstance(entry, int):
            messages.append([dispatches[entry]])
        else:
            messages.extend(split(lines[entry], most))
    return messages


def split(items: list[Dispatch], most: int) -> list[list[Dispatch]]:
    """``items`` in the fewest groups of at most ``most``, their sizes differing by one at
    most (200 by 8: 25 of 8; 9 by 8: 5 and 4, not 8 and 1)."""
    count = -(-len(items) // most)
    size, extra = divmod(len(items), count)
    groups, start = [], 0
    for g in range(count):
        end = start + size + (1 if g < extra else 0)
        groups.append(items[start:end])
        start = end
    return groups
