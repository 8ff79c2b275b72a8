"""examples/child.yaml in Python: the diamond runs as a child, then again on its total."""

from __future__ import annotations

import conveyor
from examples.python.diamond import DiamondInput, diamond

child = conveyor.Flow(
    "child",
    input=DiamondInput,
    description="Run the diamond as a child on x, then again on the first run's total.",
)

# A child node's output is typed as the child flow's output (DiamondOutput).
first = child.child("first", diamond, inputs={"x": child.input["x"]})
again = child.child("again", diamond, inputs={"x": first.out["total"]})
child.returns({"first": first.out["total"], "second": again.out["total"]})
