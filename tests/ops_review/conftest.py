"""Fixtures of the delivery tests; the platform's synthesized app is the session's shared `cloud_assembly`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cdk_context as load_cdk_context


@pytest.fixture(scope="session")
def cdk_context() -> dict[str, Any]:
    """cdk.json's context without pipeline settings: the pipeline tests bring their own."""
    context = load_cdk_context()
    context.pop("pipeline", None)
    return context


@pytest.fixture(scope="session")
def platform_assembly(cloud_assembly: Any) -> Path:
    """cdk.out of every environment in cdk.json, synthesized once per session through the compliance gates."""
    return Path(cloud_assembly.directory)
