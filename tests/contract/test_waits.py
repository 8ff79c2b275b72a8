"""Wait nodes (tests/unit/transitions/test_waits.py) on every adapter."""

import pytest

from tests.unit.transitions.test_waits import *  # noqa: F403

pytestmark = pytest.mark.contract
