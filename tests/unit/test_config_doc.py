"""docs/configuration.md is generated from the settings models: these fail when it drifts from the code, or when a
setting or threshold key is added without words for the operator."""

from __future__ import annotations

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from compactd.app import config_doc
from compactd.policy.thresholds import Thresholds
from compactd.settings import Settings


def _fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, FieldInfo]]:
    """Every field of a model, nested models' fields too (`topics.segments`), walked independently of config_doc."""
    out: list[tuple[str, FieldInfo]] = []
    for name, field in model.model_fields.items():
        out.append((prefix + name, field))
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out += _fields(field.annotation, f"{prefix}{name}.")
    return out


def _is_model(field: FieldInfo) -> bool:
    return isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)


def test_generated_file_is_current() -> None:
    assert config_doc.OUTPUT.read_text(encoding="utf-8") == config_doc.render(), (
        "docs/configuration.md differs from what the code generates: run `make docs`"
    )


def test_every_setting_and_threshold_key_is_in_the_reference() -> None:
    text = config_doc.render()
    for path, field in _fields(Settings):
        if _is_model(field):
            assert f"`{path}." in text, path  # a nested model is documented through its own fields
        else:
            env = "COMPACTD_" + path.replace(".", "__").upper()
            assert f"| `{path}` | `{env}` |" in text, path
    for name, field in Thresholds.model_fields.items():
        assert field.alias, name  # users write the dotted alias; a key without one would be undocumented as such
        assert f"| `{field.alias}` |" in text, field.alias


@pytest.mark.parametrize(
    ("model", "prefix"), [(Settings, ""), (Thresholds, "thresholds: ")], ids=["settings", "thresholds"]
)
def test_every_field_has_a_description(model: type[BaseModel], prefix: str) -> None:
    missing = [path for path, field in _fields(model) if not (field.description or "").strip()]
    assert not missing, f"{prefix}add Field(description=...) to: {', '.join(missing)}"


def test_environment_names_are_the_ones_pydantic_settings_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(config_doc.env_name(("metrics", "top_n")), "7")
    monkeypatch.setenv(config_doc.env_name(("cluster",)), "from-env")
    settings = Settings()
    assert settings.metrics.top_n == 7 and settings.cluster == "from-env"


def test_a_secret_default_is_never_shown() -> None:
    field = Settings.model_fields["redis_password"]
    assert config_doc.default_text(field, "hunter2") == "*(secret)*"
    assert config_doc.default_text(Settings.model_fields["config_secrets"], ["hunter2"]) == "*(secret)*"
