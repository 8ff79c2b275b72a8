"""Trigger and plan (tests/unit/transitions/test_triggering.py) on every adapter."""

import pytest

from tests.unit.transitions.test_triggering import *  # noqa: F403

pytestmark = pytest.mark.contract
