"""The tenant stream's event ids (GET /v1/stream, Last-Event-ID; Conveyor.stream(after=...))."""

from __future__ import annotations

import pytest

from conveyor.service.reads import cursor_of, event_id


def test_an_event_id_names_its_cursor_and_back() -> None:
    assert cursor_of("48213-907") == (48213, 907)
    assert cursor_of(event_id((0, 12))) == (0, 12)


@pytest.mark.parametrize(
    "given", ["", "yesterday", "12", "12-", "-3", "1-2-3", "²-1", "1-99999999999999999999"]
)
def test_an_id_that_is_none_of_the_streams_is_refused_naming_the_form(given: str) -> None:
    with pytest.raises(ValueError, match="two numbers joined by '-'"):
        cursor_of(given)
