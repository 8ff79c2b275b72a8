"""The schedules' due check, events and webhook deliveries, on every adapter
(the cases of tests/unit/transitions/test_scheduling.py)."""

import pytest

from tests.unit.transitions.test_scheduling import *  # noqa: F403

pytestmark = pytest.mark.contract
