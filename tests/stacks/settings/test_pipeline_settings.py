"""The promotion pipeline's settings (cdk.json "pipeline"): optional, an object, and every bad value refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from stacks.settings import SettingsError, load_pipeline
from tests.stacks.components.promotion_targets import PIPELINE


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"account": "12345"}, "pipeline.account: must be a 12-digit AWS account id in quotes."),
        (
            {"connection_arn": "arn:aws:s3:::bucket"},
            "pipeline.connection_arn: must be a CodeConnections connection ARN",
        ),
        ({"repository": "pytorch-platform"}, "pipeline.repository: must be owner/repository"),
        ({"branch": "feature..x"}, "pipeline.branch: must be a git branch name"),
        ({"branch": "release/"}, "pipeline.branch: must be a git branch name"),
        ({"region": "oregon"}, "pipeline.region: must be an AWS region code"),
        ({"stages": ["dev"]}, "pipeline.stages: unknown setting; allowed keys are account, branch, connection_arn"),
    ],
)
def test_bad_pipeline_settings_stop_synth_with_one_sentence(change: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError) as error:
        load_pipeline({**PIPELINE, **change})
    assert str(error.value).startswith(message)
    assert str(error.value).count(".") >= 1 and "\n" not in str(error.value)


def test_pipeline_settings_are_optional_and_must_be_an_object() -> None:
    assert load_pipeline(None) is None
    assert load_pipeline(PIPELINE).branch == "main"
    with pytest.raises(SettingsError, match=r"^pipeline: must be an object"):
        load_pipeline("true")
    with pytest.raises(SettingsError, match=r"^pipeline.repository: is required\.$"):
        load_pipeline({k: v for k, v in PIPELINE.items() if k != "repository"})
