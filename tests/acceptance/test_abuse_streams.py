"""`conveyor api` in its own process ends its live streams cleanly when told to stop: uvicorn
alone would wait for them to finish, which a stream does only with its execution. On the
embedded default (SQLite, no broker), so it touches no shared service."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

import httpx

from tests.acceptance.conftest import ROOT, _wait_until_ready
from tests.acceptance.test_cli import CONVEYOR, conveyor

SLOW = {"name": "slow", "nodes": [{"id": "wait", "type": "delay", "config": {"seconds": 600}}]}


def test_conveyor_api_ends_its_streams_cleanly_on_sigterm_and_exits(tmp_path: Path) -> None:
    # Given `conveyor api` on the embedded default, and a stream on an execution that waits
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["PYTHONPATH"] = str(ROOT)
    made = conveyor("keys", "create", env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "api.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [*CONVEYOR, "api", "--port", str(port)], cwd=tmp_path, env=env, text=True,
            stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_until_ready(process, log, "Uvicorn running on")
        http = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {made.stdout.strip()}"},
            timeout=30,
        )
        assert http.post("/v1/workflows", json=SLOW).status_code == 201
        started = http.post("/v1/workflows/slow/executions", json={})
        assert started.status_code == 201, started.text
        lines: list[str] = []
        failure: list[BaseException] = []
        opened = threading.Event()

        def listen() -> None:
            try:
                with http.stream("GET", f"/v1/executions/{started.json()['id']}/events") as s:
                    for line in s.iter_lines():  # an unclean end raises here
                        lines.append(line)
                        opened.set()
            except BaseException as exc:  # reported by the test below
                failure.append(exc)

        reader = threading.Thread(target=listen)
        reader.start()
        assert opened.wait(10)

        # When it is told to stop
        process.send_signal(signal.SIGTERM)

        # Then the stream ends cleanly, without a finished status, and the process exits
        reader.join(timeout=15)
        assert not reader.is_alive() and failure == []
        assert 'data: {"status": "running"}' in lines
        # (uvicorn re-raises the signal it caught once it has shut down)
        assert process.wait(timeout=15) in (0, -signal.SIGTERM), log.read_text()
        assert "Application shutdown complete" in log.read_text()
        http.close()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
