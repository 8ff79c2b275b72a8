"""docs/settings.md is what the settings class says: regenerated whenever a setting changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor import settings_reference
from conveyor.config import Settings


def test_docs_settings_md_is_up_to_date_with_the_settings_class() -> None:
    expected = settings_reference.render()
    actual = settings_reference.DOCUMENT.read_text()

    assert actual == expected, (
        f"docs/settings.md differs from conveyor/config.py: run "
        f"`{settings_reference.COMMAND}` and commit docs/settings.md"
    )


def test_every_setting_has_a_description() -> None:
    missing = [name for name, field in Settings.model_fields.items() if not field.description]
    assert missing == [], f"settings without a description in conveyor/config.py: {missing}"


def test_the_reference_lists_every_setting_with_its_type_bounds_and_default() -> None:
    text = settings_reference.render()

    for name in Settings.model_fields:
        assert f"| `CONVEYOR_{name.upper()}` |" in text
    assert "| `CONVEYOR_API_PORT` | integer, ≥ 1, ≤ 65535 | `8000` |" in text
    assert "| `CONVEYOR_LOG_FORMAT` | `json` or `console` | `json` |" in text
    assert "| `CONVEYOR_IMPORTS` | list of strings | (empty) |" in text
    assert "| `CONVEYOR_LIMITS_ENABLED` | boolean | true |" in text


def test_the_check_command_fails_on_a_stale_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = tmp_path / "settings.md"
    stale.write_text("# Settings\n")
    monkeypatch.setattr(settings_reference, "DOCUMENT", stale)

    assert settings_reference.main(["--check"]) == 1
    assert settings_reference.main([]) == 0
    assert settings_reference.main(["--check"]) == 0
