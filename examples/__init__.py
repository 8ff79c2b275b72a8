"""Example workflows (YAML, and Python under examples/python)."""
