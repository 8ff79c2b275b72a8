"""Per-trigger limits (tests/unit/transitions/test_trigger_limits.py) on every adapter."""

import pytest

from tests.unit.transitions.test_trigger_limits import *  # noqa: F403

pytestmark = pytest.mark.contract
