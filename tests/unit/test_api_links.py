"""The OpenAPI links of the API's schema (conveyor.api.links) point at operations that exist
and name parameters those operations take."""

from __future__ import annotations

from conveyor.api.app import create_app


def test_every_link_names_an_existing_operation_and_one_of_its_path_parameters() -> None:
    schema = create_app().openapi()
    operations = {
        operation["operationId"]: operation
        for methods in schema["paths"].values()
        for operation in methods.values()
    }

    links = [
        link
        for methods in schema["paths"].values()
        for operation in methods.values()
        for response in operation["responses"].values()
        for link in response.get("links", {}).values()
    ]

    assert len(links) >= 15
    for link in links:
        target = operations[link["operationId"]]
        taken = {p["name"] for p in target.get("parameters", []) if p["in"] == "path"}
        assert set(link["parameters"]) <= taken, link
        assert all(v.startswith("$response.body#/") for v in link["parameters"].values())


def test_a_trigger_links_its_answers_id_to_the_execution_it_made() -> None:
    responses = create_app().openapi()["paths"]["/v1/workflows/{name}/executions"]["post"][
        "responses"
    ]

    for status in ("200", "201"):
        link = responses[status]["links"]["ShowExecution"]
        assert link["parameters"] == {"execution_id": "$response.body#/id"}
