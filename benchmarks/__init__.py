"""Benchmarks: Conveyor measured side by side with raw Celery, on this machine's services."""
