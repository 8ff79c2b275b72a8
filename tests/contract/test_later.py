"""Delays at the edges (tests/unit/transitions/test_later.py) on every adapter."""

import pytest

from tests.unit.transitions.test_later import *  # noqa: F403

pytestmark = pytest.mark.contract
