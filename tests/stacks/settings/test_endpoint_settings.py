"""The endpoints' settings: what the Graviton endpoint no longer takes, and the model names the multi-model endpoint's
invoke grant may name."""

from __future__ import annotations

import copy

import pytest

from stacks.settings import SettingsError, parse_environment
from tests.conftest import cdk_context

RAW = cdk_context()["environments"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("image_repository", "pytorch-inference-arm64"),
        ("image_tag", "2.6.0-cpu-py312-ubuntu22.04-sagemaker"),
        ("dependencies", "install_at_startup"),
    ],
)
def test_the_torchserve_image_settings_are_gone(key: str, value: str) -> None:
    """The endpoint runs the platform's image only: the DLC's settings and start-up installs stop synth by name."""
    raw = RAW["dev"]
    with pytest.raises(SettingsError, match=rf"^environments\.dev\.graviton_endpoint\.{key}: "):
        parse_environment("dev", {**raw, "graviton_endpoint": {**raw["graviton_endpoint"], key: value}})


def test_settings_refuse_bad_allowed_models() -> None:
    raw = copy.deepcopy(RAW["dev"])
    raw["multi_model_endpoint"]["invoke_allowed_models"] = ["../other.tar.gz"]
    with pytest.raises(SettingsError, match=r"multi_model_endpoint\.invoke_allowed_models.*model name"):
        parse_environment("dev", raw)
