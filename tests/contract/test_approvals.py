"""Approvals (tests/unit/transitions/test_approvals.py) on every adapter."""

import pytest

from tests.unit.transitions.test_approvals import *  # noqa: F403

pytestmark = pytest.mark.contract
