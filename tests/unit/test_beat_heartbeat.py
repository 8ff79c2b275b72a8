"""Beat's liveness: the scheduler touches its heartbeat file at every tick, and the check
that container health checks and Kubernetes probes run tells a fresh file from a stale one."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.config import Settings, get_settings
from conveyor.scheduler import heartbeat
from conveyor.tasks.app import create_app
from conveyor.tasks.beat import HeartbeatScheduler


@pytest.fixture
def heartbeat_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "beat.heartbeat"
    monkeypatch.setenv("CONVEYOR_BEAT_HEARTBEAT_FILE", str(path))
    get_settings.cache_clear()
    yield path
    get_settings.cache_clear()


def test_beat_touches_its_heartbeat_file_at_every_tick(heartbeat_file: Path) -> None:
    app = create_app(Settings(broker_url="memory://", beat_heartbeat_file=str(heartbeat_file)))
    assert app.conf.beat_scheduler == "conveyor.tasks.beat:HeartbeatScheduler"
    scheduler = HeartbeatScheduler(app=app)

    scheduler.tick()

    assert heartbeat_file.exists()
    assert heartbeat.main() == 0


def test_the_check_fails_when_the_heartbeat_is_stale_or_missing(
    heartbeat_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert heartbeat.main() == 1
    assert f"no heartbeat at {heartbeat_file}" in capsys.readouterr().err

    heartbeat.touch(heartbeat_file)
    limit = heartbeat.max_age(get_settings())
    old = time.time() - limit - 5
    os.utime(heartbeat_file, (old, old))

    assert heartbeat.main() == 1
    assert "it is stuck" in capsys.readouterr().err


def test_the_check_allows_twice_the_shortest_beat_interval() -> None:
    # the recovery sweep (30 s) is beat's most frequent entry by default
    assert heartbeat.max_age(Settings()) == 2 * 30 + heartbeat.MARGIN
    assert heartbeat.max_age(Settings(recover_interval=600, retention_interval=600)) == 150


def test_the_check_refuses_to_pass_when_no_heartbeat_file_is_set(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CONVEYOR_BEAT_HEARTBEAT_FILE", raising=False)
    get_settings.cache_clear()
    try:
        assert heartbeat.main() == 1
    finally:
        get_settings.cache_clear()
    assert "CONVEYOR_BEAT_HEARTBEAT_FILE is not set" in capsys.readouterr().err


def test_beat_goes_on_when_it_cannot_write_its_heartbeat(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the in-process worker of the integration tier leaves the root logger at ERROR
    caplog.set_level(logging.WARNING, logger="conveyor.beat")
    unwritable = tmp_path / "no-such-directory" / "beat.heartbeat"
    app = create_app(Settings(broker_url="memory://", beat_heartbeat_file=str(unwritable)))

    interval = HeartbeatScheduler(app=app).tick()

    assert interval > 0
    assert f"beat cannot touch its heartbeat file {unwritable}" in caplog.text


@pytest.mark.parametrize(("interval", "expires"), [(1.0, 10.0), (9.5, 10.0), (30.0, 30.0)])
def test_a_recovery_sweep_expires_after_its_interval_but_never_within_ten_seconds(
    interval: float, expires: float
) -> None:
    # A planner busier than a short interval still runs the sweeps it is sent
    app = create_app(Settings(broker_url="memory://", recover_interval=interval))

    recover = app.conf.beat_schedule["conveyor-recover"]

    assert recover["schedule"] == interval
    assert recover["options"] == {"queue": "workflow-scheduled", "expires": expires}


@pytest.mark.parametrize(("interval", "expires"), [(1.0, 10.0), (60.0, 60.0)])
def test_a_due_check_expires_after_its_interval_but_never_within_ten_seconds(
    interval: float, expires: float
) -> None:
    # A scheduled-queue worker busier than a short interval still runs the checks it is sent
    app = create_app(Settings(broker_url="memory://", schedule_check_interval=interval))

    check = app.conf.beat_schedule["conveyor-schedule-check"]

    assert check["options"] == {"queue": "workflow-scheduled", "expires": expires}
