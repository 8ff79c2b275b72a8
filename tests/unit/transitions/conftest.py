"""The transitions' cases on the in-memory store (tests/contract runs them on every adapter)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.bench import Bench, fresh_engine_memory, memory_bench


@pytest.fixture(autouse=True)
def _fresh_engine_memory() -> Iterator[None]:
    with fresh_engine_memory():
        yield


@pytest.fixture
def bench() -> Bench:
    return memory_bench()
