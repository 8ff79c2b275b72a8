"""Pure orchestration: definitions, validation, DAG planning, state transitions, retries."""
