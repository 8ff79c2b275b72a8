"""The root's dispatcher loads Celery at its first publish, builds the process's one Celery app
(the app the tasks are registered on), and the message reaches the broker."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import redis

from conveyor.migrations import ROOT
from tests.conftest import REDIS_URL

FIRST_PUBLISH = """
import sys, uuid
from conveyor import wiring
from conveyor.engine.records import Dispatch
from conveyor.engine.states import JobKind, Priority

service = wiring.service()
assert "celery" not in sys.modules, "celery was imported before the first publish"
job = Dispatch(
    job_id=uuid.UUID(sys.argv[1]), kind=JobKind.NODE, queue=sys.argv[2], priority=Priority.NORMAL
)
service.dispatcher.publish([job])
assert "celery" in sys.modules, "the first publish did not load celery"
built = wiring.celery_app()
import conveyor.tasks
assert conveyor.tasks.app is built, "the tasks are registered on another app"
assert "conveyor.node.run" in built.tasks
"""


def test_the_first_publish_builds_the_celery_app_the_tasks_use_and_sends_through_it(
    database_url: str,
) -> None:
    job_id, queue = uuid.uuid4(), f"test-wiring-{uuid.uuid4().hex[:8]}"  # no worker serves it
    client = redis.Redis.from_url(REDIS_URL)
    try:
        done = subprocess.run(
            [sys.executable, "-c", FIRST_PUBLISH, str(job_id), queue],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr

        keys = [queue, *(f"{queue}:{step}" for step in range(1, 10))]
        messages = [json.loads(raw) for key in keys for raw in client.lrange(key, 0, -1)]
        assert [m["headers"]["argsrepr"] for m in messages] == [f"job={job_id}"]
    finally:
        client.delete(queue, *(f"{queue}:{step}" for step in range(1, 10)))
        client.close()
