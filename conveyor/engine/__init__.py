"""Pure orchestration: definitions, validation, DAG planning, state transitions, retries."""

# A child's finish settles its parent's node through conveyor.engine.parents, which the
# children module binds as it is imported: first, so that no transition runs unbound.
from conveyor.engine import children as _children  # noqa: F401
