"""The RabbitMQ variant of the compose stack (compose/rabbitmq.yml over docker-compose.yml),
checked without Docker: merged as Compose merges an override (mappings key by key), every
Conveyor service publishes to RabbitMQ and waits for it, and Redis still holds the permits."""

from __future__ import annotations

from typing import Any

import yaml

from conveyor.migrations import ROOT

BASE = ROOT / "compose" / "docker-compose.yml"
OVERRIDE = ROOT / "compose" / "rabbitmq.yml"


def merged(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: merged(base[k], v) if k in base else v for k, v in over.items()} | {
            k: v for k, v in base.items() if k not in over
        }
    return over


def services() -> dict[str, Any]:
    stack = merged(yaml.safe_load(BASE.read_text()), yaml.safe_load(OVERRIDE.read_text()))
    return dict(stack["services"])


def test_every_conveyor_service_of_the_variant_publishes_to_rabbitmq_and_waits_for_it() -> None:
    stack = services()
    base = yaml.safe_load(BASE.read_text())["services"]
    conveyors = [name for name, s in base.items() if "image" in s and "conveyor" in s["image"]]

    assert conveyors and set(conveyors) <= set(yaml.safe_load(OVERRIDE.read_text())["services"])
    for name in conveyors:
        env, waits = stack[name]["environment"], stack[name]["depends_on"]
        assert (
            env["CONVEYOR_BROKER_URL"].startswith("amqp://")
            and "@rabbitmq:5672/" in env["CONVEYOR_BROKER_URL"]
        ), name
        assert env["CONVEYOR_REDIS_URL"].startswith("redis://"), name  # the permits stay
        assert waits["rabbitmq"] == {"condition": "service_healthy"}, name
        assert "migrate" in waits or name == "migrate", name


def test_the_variant_s_rabbitmq_is_health_checked_and_keeps_its_messages_in_a_volume() -> None:
    rabbitmq = services()["rabbitmq"]
    assert rabbitmq["healthcheck"]["test"][:2] == ["CMD", "rabbitmq-diagnostics"]
    assert any(v.endswith(":/var/lib/rabbitmq") for v in rabbitmq["volumes"])
    assert rabbitmq["hostname"] == "rabbitmq"
