"""`conveyor executions watch --json` run as a person runs it: a process of its own, its
events read line by line as they come, and stopped with Ctrl-C (SIGINT)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CONVEYOR = str(Path(sys.executable).parent / "conveyor")  # the installed console script

Event = dict[str, Any]  # {"id", "kind", "data"}: one line of --json

# Runs the command with SIGINT at its default, as a terminal's foreground job has it. A job
# that a shell without job control started in the background (`cmd &`: scripts/test's side
# lanes, a CI runner's) ignores SIGINT, its children inherit that, and Python then installs
# no KeyboardInterrupt: a Ctrl-C would be lost on the watch. exec keeps the default.
_AS_IN_A_TERMINAL = (
    sys.executable, "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])",
)  # fmt: skip


class Watch:
    """A running ``conveyor executions watch --json``: threads read its stdout's lines onto
    a queue (a test waits for them with a deadline) and keep its stderr."""

    def __init__(self, *args: str, env: dict[str, str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            [*_AS_IN_A_TERMINAL, CONVEYOR, "executions", "watch", "--json", *args],
            env=env, cwd=cwd, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.errors: list[str] = []
        self._watching = threading.Event()
        self._readers = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self._ready()

    def _read_out(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def _read_err(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.errors.append(line)
            if "watching" in line:
                self._watching.set()

    def _ready(self) -> None:
        """Wait for its notice on stderr: it has taken where the stream stands (the events
        from then on are its)."""
        deadline = time.monotonic() + 60
        while not self._watching.wait(0.1):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"watch did not start: {self.stderr}")

    @staticmethod
    def run(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
        """A watch that is to end by itself (refused)."""
        return subprocess.run(
            [CONVEYOR, "executions", "watch", "--json", *args],
            env=env, cwd=cwd, text=True, capture_output=True, timeout=60,
        )  # fmt: skip

    @property
    def stderr(self) -> str:
        return "".join(self.errors)

    def collect(self, until: Callable[[list[Event]], bool], seconds: float = 30) -> list[Event]:
        """Events until ``until`` holds of those collected (each line one JSON object)."""
        got: list[Event] = []
        deadline = time.monotonic() + seconds
        while not until(got):
            assert time.monotonic() < deadline, f"watch printed only {got}"
            try:
                got.append(json.loads(self.lines.get(timeout=0.5)))
            except queue.Empty:
                assert self.process.poll() is None, f"watch ended: {self.stderr}"
        return got

    def stop(self) -> int:
        """Ctrl-C; its exit status, once its output is read to the end."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join(timeout=5)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()
        return self.process.returncode


def finished(execution_id: str, status: str = "completed") -> Callable[[list[Event]], bool]:
    return lambda got: any(
        e["data"]["execution_id"] == execution_id and e["data"]["status"] == status for e in got
    )
