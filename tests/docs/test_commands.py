"""The README is a short front door, and what it and docs/ tell people to run exists: make targets, `pytorch-platform`
subcommands, `python -m` modules, settings keys and repository paths."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
from pydantic import BaseModel

from platform_cli import SUBCOMMANDS
from stacks.settings import EnvironmentSettings, PipelineSettings
from tests.docs.markdown import ROOT, code, documents, split_code

README = ROOT / "README.md"
MAX_README_LINES = 250
# Generated from the settings model itself (tests/docs/test_settings_reference.py keeps it current).
CHECKED = [page for page in documents() if page.name != "settings.md"]
IDS = [page.relative_to(ROOT).as_posix() for page in CHECKED]


def _makefile_targets() -> tuple[set[str], set[str]]:
    """Every rule's target, and the .PHONY ones (the commands people run)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.MULTILINE))
    phony = {name for line in re.findall(r"^\.PHONY:(.*)$", text, re.MULTILINE) for name in line.split()}
    return targets, phony


def _make_commands(snippets: list[str]) -> set[str]:
    return {m for s in snippets for m in re.findall(r"(?<![\w-])make\s+(?:-C\s+\S+\s+)?([a-z][\w-]*)", s)}


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_ci_runs_the_readmes_test_command() -> None:
    """The quick start's two commands: `make synth` (the main job) and `make test`, which `.ci/run` runs (then the same
    suite in one shuffled order, `make test-random SEED=<n>`, and the fast tests in an order from the commit's hash)."""
    run = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    commands = [line for line in run if line and not line.startswith(("#", "set ", "cd "))]
    assert commands[0] == "make test"
    assert len(commands) == 3 and re.fullmatch(r"make test-random SEED=\d+", commands[1]), commands
    commit_seed = 'make test-random SEED="$((16#$(git rev-parse --short=7 HEAD)))" MARK="not slow"'
    assert commands[2] == commit_seed, commands
    quick_start = README.read_text(encoding="utf-8").split("## Quick start")[1].split("\n## ")[0]
    assert {"synth", "test"} <= _make_commands(code(quick_start))
    assert ".ci/run" in quick_start


def test_the_pipeline_builds_with_the_readmes_commands() -> None:
    from stacks.components.promotion_pipeline import SYNTH_COMMANDS

    quick_start = README.read_text(encoding="utf-8").split("## Quick start")[1].split("\n## ")[0]
    assert {command.removeprefix("make ") for command in SYNTH_COMMANDS} <= _make_commands(code(quick_start))


def test_the_readme_lists_every_make_target_people_run() -> None:
    _, phony = _makefile_targets()
    assert phony - _make_commands(code(README.read_text(encoding="utf-8"))) == set()


@pytest.mark.parametrize("page", CHECKED, ids=IDS)
def test_every_make_target_named_exists(page: Path) -> None:
    targets, _ = _makefile_targets()
    assert _make_commands(code(page.read_text(encoding="utf-8"))) - targets == set()


def test_the_readme_lists_every_subcommand() -> None:
    snippets = code(README.read_text(encoding="utf-8"))
    assert set(SUBCOMMANDS) <= {s.strip() for s in snippets}


@pytest.mark.parametrize("page", CHECKED, ids=IDS)
def test_every_subcommand_named_exists(page: Path) -> None:
    named = {
        m for s in code(page.read_text(encoding="utf-8")) for m in re.findall(r"pytorch-platform\s+([a-z][\w-]*)", s)
    }
    assert named - set(SUBCOMMANDS) == set()


@pytest.mark.parametrize("page", CHECKED, ids=IDS)
def test_every_python_module_named_exists(page: Path) -> None:
    modules = {
        m for s in code(page.read_text(encoding="utf-8")) for m in re.findall(r"(?:-m|--module)\s+([a-z_][\w.]*)", s)
    }
    missing = {m for m in modules if m != "pytest" and importlib.util.find_spec(m) is None}
    assert missing == set()


def _has_key(model: type[BaseModel], path: list[str]) -> bool:
    """Whether ``path`` (``*`` allowed as its last part) names a field of ``model`` or of its nested models."""
    head, *rest = path
    if head == "*" and not rest:
        return True
    field = model.model_fields.get(head)
    if field is None:
        return False
    if not rest:
        return True
    nested = [a for a in (field.annotation, *getattr(field.annotation, "__args__", ())) if isinstance(a, type)]
    models = [a for a in nested if issubclass(a, BaseModel)]
    return bool(models) and _has_key(models[0], rest)


_FILE_SUFFIXES = {"py", "json", "md", "yaml", "yml", "sh", "txt", "lock", "gz", "png", "csv"}


def settings_keys(snippets: list[str]) -> set[str]:
    """Dotted settings keys in code: `graviton_endpoint.model_data_key`, `environments.dev.vpc.cidr`, `pipeline.*`."""
    roots = "|".join(sorted([*EnvironmentSettings.model_fields, "pipeline", "environments"], key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w/.$-])(?:{roots})(?:\.(?:[A-Za-z_<>|][\w<>|]*|\*))+")
    found = {m.group(0) for s in snippets for m in pattern.finditer(s)}
    return {key for key in found if key.rsplit(".", 1)[1] not in _FILE_SUFFIXES}


def _key_exists(key: str) -> bool:
    parts = key.split(".")
    if parts[0] == "environments":
        parts = parts[2:]  # environments.<env>.<key>
    if parts and parts[0] == "pipeline" and "pipeline" not in EnvironmentSettings.model_fields:
        return len(parts) > 1 and _has_key(PipelineSettings, parts[1:])
    return bool(parts) and _has_key(EnvironmentSettings, parts)


@pytest.mark.parametrize("page", CHECKED, ids=IDS)
def test_every_settings_key_named_exists(page: Path) -> None:
    keys = settings_keys(code(page.read_text(encoding="utf-8")))
    assert {key for key in keys if not _key_exists(key)} == set()


def test_the_key_finder_finds_keys_and_skips_code() -> None:
    snippets = [
        "graviton_endpoint.model_data_key",
        "environments.<env>.training.hyperparameters.bf16",
        "vpc.nat_gateways: 0",
        "pipeline.*",
        "training.py           TrainingStack",
        "python -m training_assets.remote_train",
        "graviton_endpoint_stack.grant_invoke(role)",
        "multi_model_endpoint.autoscaling.max_capaciti",
    ]
    keys = settings_keys(snippets)
    assert keys == {
        "graviton_endpoint.model_data_key",
        "environments.<env>.training.hyperparameters.bf16",
        "vpc.nat_gateways",
        "pipeline.*",
        "multi_model_endpoint.autoscaling.max_capaciti",
    }
    assert {key for key in keys if not _key_exists(key)} == {"multi_model_endpoint.autoscaling.max_capaciti"}


def _tracked_folders() -> list[str]:
    """The repository's top-level folders that git tracks files in (build outputs such as cdk.out/ are not)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return sorted({f.split("/", 1)[0] for f in files if "/" in f})


_TOP_LEVEL = _tracked_folders()


@pytest.mark.parametrize("page", CHECKED, ids=IDS)
def test_every_repository_path_named_exists(page: Path) -> None:
    """Paths into the repository's folders (`stacks/foundation.py`, `proving_ground/benchmarks/results/...`), in code
    or in prose, name real files."""
    text = page.read_text(encoding="utf-8")
    prose, _ = split_code(text)
    roots = "|".join(re.escape(name) for name in _TOP_LEVEL)
    pattern = re.compile(rf"(?<![\w./-])(?:{roots})/[\w./<>*{{}}-]*")
    named = {m.group(0).rstrip(".") for s in [*code(text), *prose] for m in pattern.finditer(s)}
    placeholders = re.compile(r"[<>*{}]")
    missing = {p for p in named if not placeholders.search(p) and not (ROOT / p).exists()}
    assert missing == set()
