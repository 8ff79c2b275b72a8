"""A node module that warns when it is imported, as a library's deprecation or Celery's
SecurityWarning would: a worker importing it (CONVEYOR_IMPORTS) must log the warning as one of
its JSON records (tests/acceptance/test_logs.py). Never imported by the test process itself,
where warnings are errors."""

from __future__ import annotations

import warnings

WARNING = "tests.support.warning_nodes warns at import"

warnings.warn(WARNING, UserWarning, stacklevel=1)
