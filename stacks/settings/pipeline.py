"""The promotion pipeline's settings (cdk.json's ``pipeline`` object): the tooling account and the repository."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError, field_validator

from stacks.settings.base import DEFAULT_REGION, AccountId, Region, SettingsError, StrictModel, describe_error

_CONNECTION_ARN = re.compile(
    r"^arn:aws[a-z-]*:(codeconnections|codestar-connections):[a-z0-9-]+:\d{12}:connection/[0-9a-f-]{36}$"
)
_REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_BRANCH = re.compile(r"^(?!/)(?!.*(\.\.|//|@\{))[A-Za-z0-9._/-]+(?<![/.])$")


class PipelineSettings(StrictModel):
    """The promotion pipeline (CDK Pipelines) in the tooling account, and the repository it deploys from."""

    account: AccountId
    region: Region = DEFAULT_REGION
    connection_arn: str
    repository: str
    branch: str = "main"

    @field_validator("connection_arn")
    @classmethod
    def _connection(cls, value: str) -> str:
        if not _CONNECTION_ARN.match(value):
            raise ValueError(
                "must be a CodeConnections connection ARN such as "
                "arn:aws:codeconnections:us-west-2:111122223333:connection/<uuid>"
            )
        return value

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str) -> str:
        if not _REPOSITORY.match(value):
            raise ValueError("must be owner/repository, for example my-org/pytorch-platform")
        return value

    @field_validator("branch")
    @classmethod
    def _branch(cls, value: str) -> str:
        if not _BRANCH.match(value):
            raise ValueError("must be a git branch name such as main or release/1.2")
        return value


def load_pipeline(raw: Any) -> PipelineSettings | None:
    """The ``pipeline`` context object validated, or None when the app has no pipeline settings."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise SettingsError("pipeline: must be an object with account, region, connection_arn, repository and branch.")
    try:
        return PipelineSettings.model_validate(raw)
    except ValidationError as error:
        raise SettingsError(describe_error(error.errors()[0], "pipeline", PipelineSettings)) from None
