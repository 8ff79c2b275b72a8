"""Dedupe policies (tests/unit/transitions/test_dedupe_policy.py) on every adapter."""

import pytest

from tests.unit.transitions.test_dedupe_policy import *  # noqa: F403

pytestmark = pytest.mark.contract
