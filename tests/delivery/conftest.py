"""Shared fixtures of the delivery tests: the real app synthesized once per session (from cdk.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app import build_app

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cdk_context() -> dict[str, Any]:
    context = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    context.pop("pipeline", None)  # the platform stages only; the pipeline has its own module fixture
    return context


@pytest.fixture(scope="session")
def platform_assembly(tmp_path_factory: pytest.TempPathFactory, cdk_context: dict[str, Any]) -> Path:
    """cdk.out of every environment in cdk.json, synthesized through the compliance gates."""
    outdir = tmp_path_factory.mktemp("platform") / "cdk.out"
    build_app(context=cdk_context, outdir=str(outdir)).synth()
    return outdir
