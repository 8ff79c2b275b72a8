"""The blocks of docs/quickstart.md that need Docker, a cluster or long-running workers, checked
without them (tests/acceptance/test_quickstart.py runs the others): its code is the
own-project example's, its worker commands serve every queue with options that exist, and
what its Docker and Kubernetes blocks name is in the compose file and the manifests."""

from __future__ import annotations

import re
import shlex
from typing import Any

import yaml
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.engine.queues import ALL_QUEUES
from conveyor.migrations import ROOT
from tests.support.doc_blocks import blocks_under, commands_of
from tests.support.logging_state import kept_logging
from tests.unit.test_deploy import COMPOSE, EXAMPLE, compose, manifests

PAGE = ROOT / "docs" / "quickstart.md"
DOCKER = "## 7. In Docker"
KUBERNETES = "## 8. On Kubernetes"


def words(step: str, block: int) -> list[list[str]]:
    """The commands of the step's ``block``-th shell block, each split as the shell splits it."""
    return [
        shlex.split(c, comments=True) for c in commands_of(blocks_under(PAGE, step, "sh")[block])
    ]


def instructions(dockerfile: str) -> list[str]:
    return [line for line in dockerfile.splitlines() if line and not line.startswith("#")]


def test_the_quickstart_code_is_the_own_project_examples() -> None:
    (module,) = blocks_under(PAGE, "## 2. Write node functions", "python")
    (workflow,) = blocks_under(PAGE, "## 3. Write a workflow", "yaml")
    (dockerfile,) = blocks_under(PAGE, DOCKER, "dockerfile")

    assert module == (EXAMPLE / "shop" / "nodes.py").read_text()
    assert workflow == (EXAMPLE / "workflows" / "order.yaml").read_text()
    assert instructions(dockerfile) == instructions((EXAMPLE / "Dockerfile").read_text())


def test_the_quickstart_starts_a_worker_for_every_queue_beat_and_the_api() -> None:
    started = words("## 6. Run it on PostgreSQL, Redis and Celery workers", 1)

    workers = [c for c in started if c[:4] == ["celery", "-A", "conveyor.tasks", "worker"]]
    assert sorted(c[c.index("-Q") + 1] for c in workers) == sorted(ALL_QUEUES)
    assert ["celery", "-A", "conveyor.tasks", "beat"] in started
    (api,) = [c for c in started if c[0] == "conveyor"]
    with kept_logging():  # the command configures this process's logging
        helped = CliRunner().invoke(app, [api[1], "--help"])
    assert helped.exit_code == 0
    for option in (w for w in api if w.startswith("--")):
        assert option in helped.stdout, f"conveyor api has no {option}"


def test_the_quickstart_compose_settings_and_services_are_the_compose_files() -> None:
    settings = words(DOCKER, 1)
    used = set(re.findall(r"\$\{(\w+)", COMPOSE.read_text()))
    assert {s[0].partition("=")[0] for s in settings} <= used
    for command in words(DOCKER, 2):
        assert command[:4] == ["docker", "compose", "-f", "compose/docker-compose.yml"]
        if "exec" in command:
            service = command[command.index("exec") + 1]
            assert service in compose(), f"the compose file has no service {service!r}"
            if "apply" in command:  # the file, where the example's Dockerfile copies it
                assert (EXAMPLE / command[-1]).is_file()


def test_the_quickstart_kubernetes_overlay_and_commands_name_the_manifests() -> None:
    (overlay,) = blocks_under(PAGE, KUBERNETES, "yaml")
    kustomization: dict[str, Any] = yaml.safe_load(overlay)
    named = {f"{d['kind'].lower()}/{d['metadata']['name']}" for _, d in manifests()}
    images = {c["image"] for _, d in manifests() if "template" in d.get("spec", {})
              for c in d["spec"]["template"]["spec"]["containers"]}  # fmt: skip

    assert kustomization["resources"][0].endswith("/deploy/kubernetes/base")
    assert [i["name"] for i in kustomization["images"]] == sorted(images) == ["conveyor"]
    for command in words(KUBERNETES, 0):
        for word in command:
            if re.fullmatch(r"(deploy|job)/conveyor-[\w-]+", word):
                kind, _, name = word.partition("/")
                full = {"deploy": "deployment"}.get(kind, kind) + "/" + name
                assert full in named, f"{' '.join(command)}: no {full} in the manifests"
