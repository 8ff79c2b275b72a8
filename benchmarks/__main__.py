"""``python -m benchmarks``: Conveyor beside raw Celery (see :mod:`benchmarks.compare`)."""

from benchmarks.compare import main

main()
