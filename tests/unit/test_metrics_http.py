"""Who may read /metrics (conveyor.api.metrics_http)."""

from __future__ import annotations

import pytest

from conveyor.api.metrics_http import bearer_matches, check_scrape
from conveyor.exceptions import MetricsAuthError, MetricsNotServed


@pytest.mark.parametrize(
    ("authorization", "matches"),
    [("Bearer t0ken", True), ("bearer  t0ken ", True), ("Bearer t0ke", False),
     ("Bearer t0ken2", False), ("Basic t0ken", False), ("t0ken", False), (None, False),
     ("Bearer ", False)],
)  # fmt: skip
def test_only_the_token_itself_as_a_bearer_matches(
    authorization: str | None, matches: bool
) -> None:
    assert bearer_matches(authorization, "t0ken") is matches


def test_without_a_token_set_the_api_port_serves_no_metrics_to_anyone() -> None:
    with pytest.raises(MetricsNotServed, match="set CONVEYOR_METRICS_TOKEN"):
        check_scrape("Bearer ", "")


def test_with_a_token_set_a_scrape_without_it_is_refused() -> None:
    with pytest.raises(MetricsAuthError, match="CONVEYOR_METRICS_TOKEN"):
        check_scrape(None, "t0ken")
    check_scrape("Bearer t0ken", "t0ken")
