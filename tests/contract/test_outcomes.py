"""Outcomes a node chooses (snooze, cancel its execution), on every adapter
(the cases of tests/unit/transitions/test_outcomes.py)."""

import pytest

from tests.unit.transitions.test_outcomes import *  # noqa: F403

pytestmark = pytest.mark.contract
