"""examples/branching.yaml in Python: a condition routes large amounts through a review."""

from __future__ import annotations

from typing import TypedDict

import conveyor
from conveyor import demo


class Amount(TypedDict):
    amount: float


branching = conveyor.Flow(
    "branching",
    input=Amount,
    description="Route by amount; the branch not taken is skipped and the join still runs.",
)

check = branching.condition("check", "input.amount > 100")

# if_true: wait a second (held in the database, not in a worker), then review.
hold = branching.delay("hold", 1, after=[check.if_true])
review = branching.call(
    demo.decide,
    id="review",
    after=[hold],
    inputs={"amount": branching.input["amount"], "reviewer": "reviewer"},
)

# if_false: approve at once.
auto_approve = branching.call(
    demo.decide,
    id="auto_approve",
    after=[check.if_false],
    inputs={"amount": branching.input["amount"], "reviewer": "rules"},
)

# One of its needs is skipped; it runs with the output of the other (a template says so).
notify = branching.call(
    demo.notify,
    id="notify",
    after=[review, auto_approve],
    inputs={"decision": "{{ nodes.review or nodes.auto_approve }}"},
)
branching.returns({"message": notify.out["message"]})
