"""The examples of examples/*.yaml written in Python (see docs/python.md)."""
