"""Alerts against real services: a threshold crossed fires once, to the log and to a real
HTTP webhook, and resolves after; one worker a turn evaluates them."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import update

from conveyor import metrics
from conveyor.alerts.duty import Alerter
from conveyor.alerts.rules import Thresholds
from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.models import AlertState
from conveyor.service import Conveyor, utcnow
from tests.conftest import REDIS_URL
from tests.support.services import wait_for


@pytest.fixture
def hook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A webhook receiver on loopback; the JSON bodies it got."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/alerts", received
    server.shutdown()
    server.server_close()


def alerter(service: Conveyor, url: str = "", interval: float = 0.0) -> Alerter:
    return Alerter(
        service.db,
        lambda: metrics.take(service.db, REDIS_URL, None),
        Thresholds(dead_letter_growth=1),
        interval=interval,
        webhook_url=url,
    )


def dead_letter(service: Conveyor) -> None:
    failing = {"name": "doomed", "defaults": {"retry": {"max_attempts": 1}},
               "nodes": [{"id": "f", "type": "python", "config": {"function": "test.fail"},
                          "inputs": {"message": "boom"}}]}  # fmt: skip
    service.apply(parse_workflow(failing))
    assert wait_for(service, service.trigger("doomed")).status is ExecutionStatus.FAILED


def test_a_new_dead_letter_fires_once_to_log_and_webhook_then_resolves(
    conveyor_service: Conveyor,
    hook: tuple[str, list[dict[str, Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, received = hook
    duty = alerter(conveyor_service, url)
    duty.run()  # the first turn only measures: growth needs an earlier count
    assert received == []

    dead_letter(conveyor_service)
    with caplog.at_level(logging.INFO, logger="conveyor.alerts"):
        duty.run()  # fires
        duty.run()  # still over? no: nothing grew since, so it resolves
        duty.run()  # and stays quiet

    assert [(e["alert"], e["status"]) for e in received] == [
        ("dead_letter_growth", "firing"),
        ("dead_letter_growth", "resolved"),
    ]
    assert "1 new dead letter(s), 1 in all" in received[0]["message"]
    firing = [r for r in caplog.records if "alert dead_letter_growth firing" in r.getMessage()]
    assert len(firing) == 1 and firing[0].levelno == logging.ERROR


def test_one_worker_a_turn_evaluates_the_alerts(conveyor_service: Conveyor) -> None:
    taken: list[str] = []

    def counting(name: str) -> Alerter:
        duty = alerter(conveyor_service, interval=20)
        real = duty.snapshot
        duty.snapshot = lambda: (taken.append(name), real())[1]  # type: ignore[method-assign]
        return duty

    # The last evaluation 30 s ago: due for these (every 20 s), not for the test worker's own
    # maintenance thread (every 60 s), which would otherwise take the turn whenever its tick
    # waited on the fixture's TRUNCATE. Written, not claimed: that tick may have taken the turn
    # already (a claim 30 s in the past then finds a newer one and gets none, under load).
    with conveyor_service.db.transaction() as store:
        store.claim_alert_turn(utcnow(), 0)  # makes the row if no one has yet
        last = utcnow() - timedelta(seconds=30)
        store.session.execute(update(AlertState).values(evaluated_at=last))
    first, second = counting("first"), counting("second")
    first.run()
    second.run()
    first.run()

    assert taken == ["first"]  # the others found the turn taken within the interval


def test_an_unreachable_webhook_is_logged_and_does_not_stop_evaluation(
    conveyor_service: Conveyor, caplog: pytest.LogCaptureFixture
) -> None:
    duty = alerter(conveyor_service, "http://127.0.0.1:9/unreachable")
    duty.run()
    dead_letter(conveyor_service)

    with caplog.at_level(logging.WARNING, logger="conveyor.alerts"):
        duty.run()

    assert any("alert webhook unreachable" in r.getMessage() for r in caplog.records)
