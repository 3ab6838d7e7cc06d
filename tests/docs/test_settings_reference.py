"""docs/settings.md is generated from the settings model and cdk.json: it must be current, list every key, and the
generator must render what a model says (type, default as the parent sets it, allowed values, description)."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import pytest
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from scripts import settings_reference
from stacks.settings import EnvironmentSettings, PipelineSettings
from tests.conftest import cdk_context

ROOT = Path(__file__).resolve().parents[2]


def test_the_checked_in_reference_is_current() -> None:
    checked_in = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    rendered = settings_reference.render()
    if checked_in != rendered:
        diff = "\n".join(
            list(
                difflib.unified_diff(
                    checked_in.splitlines(), rendered.splitlines(), "checked in", "rendered", lineterm=""
                )
            )[:40]
        )
        pytest.fail(f"docs/settings.md is stale: run `make docs` and commit the result.\n{diff}")


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every leaf key of a settings model, walked through model_fields (not the generator's JSON-schema walk)."""
    keys = []
    for name, info in model.model_fields.items():
        nested = [
            a for a in (info.annotation, *get_args(info.annotation)) if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        keys += _leaf_keys(nested[0], f"{prefix}{name}.") if nested else [prefix + name]
    return keys


@pytest.mark.parametrize("model", [EnvironmentSettings, PipelineSettings])
def test_every_key_of_the_model_has_a_row(model: type[BaseModel]) -> None:
    rendered = settings_reference.render()
    keys = _leaf_keys(model)
    assert len(keys) > 3
    missing = [key for key in keys if f"| `{key}` |" not in rendered]
    assert missing == []


def test_every_key_cdk_json_sets_is_in_the_per_environment_table() -> None:
    table = settings_reference.render().split("## What cdk.json sets per environment")[1].split("\n## ")[0]

    def leaves(raw: dict[str, Any], prefix: str = "") -> list[str]:
        return [
            k
            for name, value in raw.items()
            for k in (
                leaves(value, f"{prefix}{name}.")
                if isinstance(value, dict) and name != "accept_unpatched_images"
                else [prefix + name]
            )
        ]

    for name, environment in cdk_context()["environments"].items():
        for key in leaves(environment):
            row = next((line for line in table.splitlines() if line.startswith(f"| `{key}` |")), None)
            assert row is not None, f"{name}: {key} has no row"


def test_the_context_keys_are_the_ones_the_app_reads() -> None:
    read = set(re.findall(r'try_get_context\("([^"]+)"\)', (ROOT / "app.py").read_text(encoding="utf-8")))
    assert read == set(settings_reference.CONTEXT_KEYS)


def test_the_injected_fields_are_set_by_the_loader_not_cdk_json() -> None:
    for environment in cdk_context()["environments"].values():
        assert not set(settings_reference.INJECTED) & set(environment)
    for name in settings_reference.INJECTED:
        assert name in EnvironmentSettings.model_fields


# A model of every shape the generator must handle, written the way stacks/settings.py writes settings.
class _Limits(BaseModel):
    """Limits of something."""

    model_config = ConfigDict(extra="forbid")
    low: Annotated[int, Field(ge=1, le=10)] = 1
    # How high it may go: a comment above the field.
    high: Annotated[int, Field(ge=1)] = 2
    ratio: Annotated[float, Field(gt=0, lt=1)] = 0.5  # a trailing comment  # fmt: skip

    @model_validator(mode="after")
    def _ordered(self) -> _Limits:
        """low must not exceed high."""
        return self


class _Toy(BaseModel):
    """A toy environment."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["dev", "prod"]
    mode: Literal["fast", "safe"] = "safe"
    owner: str
    note: str | None = Field(default=None, description="Described | with a pipe.")
    items: list[Annotated[str, Field(min_length=2)]] = []
    reasons: dict[str, str] = {}
    limits: _Limits = _Limits(high=7)
    optional_limits: _Limits | None = None
    factory_limits: _Limits = Field(default_factory=lambda: _Limits(low=5))
    factory_items: list[str] = Field(default_factory=lambda: ["a"])

    @field_validator("owner")
    @classmethod
    def _owner(cls, value: str) -> str:
        return value


def _row(rendered: str, key: str, cells: int = 5) -> list[str]:
    """The cells of the row of ``key`` in a table of ``cells`` columns (5: the model's tables)."""
    for line in rendered.splitlines():
        if line.startswith(f"| `{key}` |"):
            row = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            if len(row) == cells:
                return row
    raise AssertionError(f"no {cells}-column row for {key}")


@pytest.fixture(scope="module")
def toy() -> str:
    cdk_json = {"context": {"environments": {"dev": {"owner": "a", "limits": {"low": 3}, "reasons": {"img:1": "why"}}}}}
    return settings_reference.render(_Toy, _Limits, cdk_json)


def test_a_required_literal_and_its_allowed_values(toy: str) -> None:
    assert _row(toy, "mode") == ["`mode`", "string", '`"safe"`', '`"fast"`, `"safe"`', ""]
    assert _row(toy, "owner") == ["`owner`", "string", "**required**", "further rules in `_Toy._owner`", ""]


def test_the_injected_name_is_explained(toy: str) -> None:
    assert _row(toy, "name")[2] == "(the environment's key)"


def test_descriptions_come_from_the_field_then_from_comments(toy: str) -> None:
    assert _row(toy, "note") == ["`note`", "string or null", "`null`", "", "Described \\| with a pipe."]
    assert _row(toy, "limits.high")[4] == "How high it may go: a comment above the field."
    assert _row(toy, "limits.ratio")[4] == "a trailing comment"
    assert _row(toy, "limits.low")[4] == ""


def test_nested_defaults_are_the_ones_the_parent_sets(toy: str) -> None:
    assert _row(toy, "limits.high")[2] == "`7`"
    assert _row(toy, "optional_limits.high")[2] == "`2`"
    assert _row(toy, "factory_limits.low")[2] == "`5`"  # a default_factory, which the JSON schema leaves out
    assert _row(toy, "factory_items")[2] == '`["a"]`'
    assert "Optional (absent by default). Limits of something." in toy


def test_bounds_lists_and_maps(toy: str) -> None:
    assert _row(toy, "limits.low")[1:4] == ["integer", "`1`", "1 to 10"]
    assert _row(toy, "limits.high")[3] == ">= 1"
    assert _row(toy, "limits.ratio")[3] == "> 0; < 1"
    assert _row(toy, "items")[1:4] == ["list of string", "`[]`", "each at least 2 characters"]
    assert _row(toy, "reasons")[1] == "map of string to string"


def test_what_the_model_config_refuses_is_said_only_when_configured(toy: str) -> None:
    assert "A key the model does not know (a misspelling) is refused too." in toy  # extra="forbid"
    assert "Types are strict" not in toy  # the toy is not strict; the platform's settings are
    assert "Types are strict" in settings_reference.render()


def test_model_validators_are_named_with_their_docstring(toy: str) -> None:
    assert "`_Limits._ordered`: low must not exceed high." in toy


def test_what_cdk_json_sets(toy: str) -> None:
    assert _row(toy, "owner", cells=2) == ["`owner`", '`"a"`']
    assert _row(toy, "limits.low", cells=2) == ["`limits.low`", "`3`"]
    assert _row(toy, "reasons", cells=2) == ["`reasons`", "`img:1`"]


def test_check_reports_a_stale_file_with_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "settings.md"
    stale.write_text("old\n", encoding="utf-8")
    assert settings_reference.main(["--check", "--output", str(stale)]) == 1
    assert "run `make docs`" in capsys.readouterr().err
    assert settings_reference.main(["--output", str(stale)]) == 0
    assert settings_reference.main(["--check", "--output", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == settings_reference.render()
