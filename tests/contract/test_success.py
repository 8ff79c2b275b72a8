"""A node's success (tests/unit/transitions/test_success.py) on every adapter."""

import pytest

from tests.unit.transitions.test_success import *  # noqa: F403

pytestmark = pytest.mark.contract
