"""Reruns from a node and the Store methods they stand on, on every adapter
(the cases of tests/unit/transitions/test_reruns.py)."""

import pytest

from tests.unit.transitions.test_reruns import *  # noqa: F403

pytestmark = pytest.mark.contract
