"""Reruns and requeues around waits (tests/unit/transitions/test_wait_reruns.py) on every
adapter."""

import pytest

from tests.unit.transitions.test_wait_reruns import *  # noqa: F403

pytestmark = pytest.mark.contract
