"""examples/flaky.yaml in Python: a node that fails twice, then succeeds on its third try."""

from __future__ import annotations

import conveyor
from conveyor import demo

flaky = conveyor.Flow(
    "flaky", description="Retries with backoff turn two transient failures into a success."
)

# Three tries, 0.5 s apart (no growth, no jitter, so the demo is deterministic).
fetch = flaky.call(
    demo.flaky,
    id="fetch",
    inputs={"succeed_on": 3},
    retry=conveyor.RetryPolicy(max_attempts=3, backoff=0.5, factor=1, jitter=0),
)
report = flaky.call(demo.report, id="report", inputs={"attempts": fetch.out["attempts"]})
flaky.returns({"message": report.out["message"]})
