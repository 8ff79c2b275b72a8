"""The deployment files, checked without Docker or a cluster (neither runs here): the compose
file builds one image and gives every long-running service a health check, the Dockerfile
copies only what .dockerignore lets through, the own-project example imports and validates,
every YAML file passes yamllint, and every Kubernetes manifest passes the Kubernetes schemas
(kubernetes-validate ships them; nothing is downloaded)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner
from yamllint import linter
from yamllint.config import YamlLintConfig

from conveyor.cli import app
from conveyor.config import get_settings
from conveyor.engine.queues import ALL_QUEUES
from conveyor.migrations import ROOT
from tests.support.logging_state import kept_logging

COMPOSE = ROOT / "compose" / "docker-compose.yml"
KUBERNETES = ROOT / "deploy" / "kubernetes" / "base"
EXAMPLE = ROOT / "examples" / "own-project"
KUBERNETES_VERSION = "1.30"
# services that are not Conveyor's own image
THIRD_PARTY = {"postgres", "redis"}


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data["services"]


def manifests() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document["kind"] != "Kustomization":
                yield path, document


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in manifests() if d["kind"] == kind}


# -- Docker Compose ---------------------------------------------------------------------------


def test_compose_builds_one_image_that_every_conveyor_service_runs() -> None:
    services = compose()
    builders = [name for name, service in services.items() if "build" in service]
    assert builders == ["migrate"], f"services with build: {builders}; only one may build"
    image = services["migrate"]["image"]
    for name, service in services.items():
        if name not in THIRD_PARTY:
            assert service["image"] == image, f"{name} runs {service['image']}, not {image}"


def test_compose_gives_every_long_running_service_a_health_check() -> None:
    services = compose()
    missing = [n for n, s in services.items() if n != "migrate" and "healthcheck" not in s]
    assert missing == []
    assert services["migrate"]["restart"] == "no"  # a one-shot job, not a service to watch


def test_compose_starts_conveyor_services_after_migrate_completes() -> None:
    services = compose()
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name, service in services.items():
        if name in THIRD_PARTY | {"migrate"}:
            continue
        assert service["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }, name
        assert service["depends_on"]["redis"] == {"condition": "service_healthy"}, name


def test_compose_checks_that_the_api_is_ready_not_only_alive() -> None:
    # a healthy API can serve: /ready checks the database, the broker and Redis
    check = compose()["api"]["healthcheck"]["test"]
    assert "http://127.0.0.1:8000/ready" in check[-1], check


def test_compose_beat_checks_the_heartbeat_it_writes() -> None:
    beat = compose()["beat"]
    assert beat["environment"]["CONVEYOR_BEAT_HEARTBEAT_FILE"]
    assert beat["healthcheck"]["test"] == ["CMD", "python", "-m", "conveyor.scheduler.heartbeat"]


# -- Dockerfile and .dockerignore -------------------------------------------------------------


def dockerignore_patterns(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    # Docker's rules (Go's filepath.Match, plus ** for any number of directories)
    out = ""
    for token in re.split(r"(\*\*/?|\*|\?)", pattern.strip("/")):
        if token.startswith("**"):
            out += "(.*/)?" if token.endswith("/") else ".*"
        elif token == "*":
            out += "[^/]*"
        elif token == "?":
            out += "[^/]"
        else:
            out += re.escape(token)
    return re.compile(out)


def ignored(relative: str, patterns: list[str]) -> bool:
    """Whether the build context leaves ``relative`` out: the last pattern that matches the
    path or one of its parent directories decides, ``!`` letting it back in."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        regex = _pattern_regex(pattern.lstrip("!"))
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            verdict = not keep
    return verdict


def copy_sources(dockerfile: Path) -> list[str]:
    sources: list[str] = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith(("COPY ", "ADD ")):
            words = [w for w in shlex.split(line)[1:] if not w.startswith("--")]
            sources += words[:-1]
    return sources


def test_dockerignore_lets_through_every_file_the_dockerfile_copies() -> None:
    patterns = dockerignore_patterns(ROOT / ".dockerignore")
    sources = copy_sources(ROOT / "Dockerfile")
    assert {"pyproject.toml", "conveyor", "migrations", "alembic.ini"} <= set(sources)
    for source in sources:
        path = ROOT / source
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        shipped = [
            f.relative_to(ROOT).as_posix()
            for f in files
            if "__pycache__" not in f.parts and f.suffix != ".pyc"
        ]
        assert shipped, f"COPY {source}: nothing there"
        left_out = [f for f in shipped if ignored(f, patterns)]
        assert left_out == [], f"COPY {source}, but .dockerignore leaves out {left_out}"


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        ".conveyor/conveyor.db",
        "compose/.env",
        "tests/conftest.py",
        "conveyor/__pycache__/config.cpython-311.pyc",
        "conveyor.egg-info/PKG-INFO",
        "benchmarks/__main__.py",
    ],
)
def test_dockerignore_leaves_out_local_state_and_secrets(path: str) -> None:
    assert ignored(path, dockerignore_patterns(ROOT / ".dockerignore"))


def test_the_dockerignore_reading_follows_dockers_last_match_rule() -> None:
    patterns = ["*", "!conveyor", "**/__pycache__"]
    assert not ignored("conveyor/config.py", patterns)
    assert ignored("conveyor/__pycache__/x.pyc", patterns)
    assert ignored("tests/x.py", patterns)


# -- The own-project example ------------------------------------------------------------------


@pytest.fixture
def own_project(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setenv("CONVEYOR_IMPORTS", "shop.nodes")
    get_settings.cache_clear()
    yield EXAMPLE
    get_settings.cache_clear()


def test_the_own_project_example_extends_the_conveyor_image() -> None:
    for name in ("Dockerfile", "README.md", "shop/nodes.py", "workflows/order.yaml"):
        assert (EXAMPLE / name).is_file(), name
    dockerfile = (EXAMPLE / "Dockerfile").read_text()
    assert re.search(r"^FROM conveyor$", dockerfile, re.MULTILINE)
    assert "ENV CONVEYOR_IMPORTS=shop.nodes" in dockerfile
    for source in copy_sources(EXAMPLE / "Dockerfile"):
        assert (EXAMPLE / source).exists(), f"the example's Dockerfile copies {source}"


def test_the_own_project_workflow_validates_against_its_node_module(own_project: Path) -> None:
    result = CliRunner().invoke(
        app, ["workflow", "validate", str(own_project / "workflows" / "order.yaml")]
    )

    assert result.exit_code == 0, result.output
    assert "valid" in result.stdout

    from conveyor.nodes import registered_functions

    assert {"shop.price_order", "shop.send_receipt"} <= registered_functions()


def test_the_own_project_nodes_compute_an_order(own_project: Path) -> None:
    from shop.nodes import price_order

    items = [{"quantity": 2, "unit_price": 9.5}, {"quantity": 1, "unit_price": 1}]
    assert price_order(items) == {"net": 20.0, "total": 24.0}


# -- YAML and Kubernetes ----------------------------------------------------------------------


def yaml_files() -> list[Path]:
    return sorted(p for folder in ("deploy", "compose") for p in (ROOT / folder).rglob("*.y*ml"))


def test_every_deployment_yaml_file_passes_yamllint() -> None:
    config = YamlLintConfig(file=str(ROOT / ".yamllint.yaml"))
    files = yaml_files()
    assert COMPOSE in files and KUBERNETES / "workers.yaml" in files
    problems = [
        f"{path.relative_to(ROOT)}:{p.line}:{p.column}: {p.message} ({p.rule})"
        for path in files
        for p in linter.run(path.read_text(), config, str(path))
    ]
    assert problems == []


def test_every_kubernetes_manifest_matches_the_kubernetes_schema() -> None:
    checked = 0
    for path, manifest in manifests():
        try:
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{path.name}: {manifest['kind']} {where}: {exc.message}")
        checked += 1
    assert checked >= 10


def test_the_schema_check_refuses_a_misspelled_field() -> None:
    api = dict(of_kind("Deployment")["conveyor-api"])
    api["spec"] = {**api["spec"], "replica": 2}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(api, KUBERNETES_VERSION, strict=True)


def test_the_kustomization_lists_every_manifest_but_the_secret_example() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present - {"secret.example.yaml"}


def containers(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = manifest["spec"]["template"]["spec"]["containers"]
    return result


def test_kubernetes_runs_one_worker_deployment_per_queue() -> None:
    queues = []
    for name, deployment in of_kind("Deployment").items():
        args = containers(deployment)[0]["args"]
        if "worker" in args:
            queues.append(args[args.index("-Q") + 1])
            # warm shutdown: the grace period must outlast a pool process's 30 s handover
            assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 30
            assert args[0] == "celery", f"{name}: celery must be PID 1 to receive SIGTERM"
    assert sorted(queues) == sorted(ALL_QUEUES)


def test_kubernetes_runs_one_beat_replaced_by_recreate_with_a_liveness_probe() -> None:
    beat = of_kind("Deployment")["conveyor-beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    probe = containers(beat)[0]["livenessProbe"]["exec"]["command"]
    assert probe == ["python", "-m", "conveyor.scheduler.heartbeat"]


def test_kubernetes_probes_the_api_on_health_and_ready() -> None:
    api = containers(of_kind("Deployment")["conveyor-api"])[0]
    assert api["livenessProbe"]["httpGet"]["path"] == "/health"
    assert api["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert "conveyor-api" in of_kind("Service")


def init_containers(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = manifest["spec"]["template"]["spec"].get("initContainers", [])
    return result


# Deployments whose processes never read the database: beat only sends messages, Flower only
# reads the broker's events
NO_SCHEMA = {"conveyor-beat", "conveyor-flower"}


def test_every_kubernetes_deployment_that_reads_the_database_waits_for_the_schema() -> None:
    # The migrate Job is applied with the Deployments: their pods must not start before it
    waiting = set()
    for name, deployment in of_kind("Deployment").items():
        commands = [c["args"][:3] for c in init_containers(deployment)]
        if ["conveyor", "db", "wait"] in commands:
            waiting.add(name)
    assert waiting == set(of_kind("Deployment")) - NO_SCHEMA
    assert "conveyor-api" in waiting and "conveyor-worker-node" in waiting
    # and the command they run is the CLI's
    with kept_logging():  # the command configures this process's logging
        helped = CliRunner().invoke(app, ["db", "wait", "--help"])
    assert helped.exit_code == 0 and "--timeout" in helped.stdout


def test_every_kubernetes_container_requests_resources_and_reads_the_settings() -> None:
    pods = [*of_kind("Deployment").values(), *of_kind("Job").values()]
    assert len(pods) == 8  # api, beat, flower, four workers, migrate
    for pod in pods:
        for container in [*init_containers(pod), *containers(pod)]:
            name = pod["metadata"]["name"]
            assert container["resources"]["requests"].keys() == {"cpu", "memory"}, name
            sources = [next(iter(s.values()))["name"] for s in container["envFrom"]]
            assert sources == ["conveyor-settings", "conveyor-secrets"], name


def test_the_secret_example_holds_placeholders_only() -> None:
    secret = of_kind("Secret")["conveyor-secrets"]
    for key, value in secret["stringData"].items():
        if "://" in value:
            assert "example.internal" in value, key
        if value:
            assert "CHANGE-ME" in value or "example.internal" in value, key
