"""The training DLC pulls, as synthesized: the EC2 instance role and the @remote job role may pull the repository that
the image table names for the image their environment chooses (the Amazon Linux 2023 ``pytorch`` repository), in the
region's DLC account, and not the repository of the Ubuntu images it replaced, which nothing chooses any more."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk import region_info

from ops_review.iam_policy import Request, is_allowed
from platform_facts.images import training_images
from proving_ground.iam_requests import logical_id, role_policies
from stacks.settings import parse_environment
from tests.conftest import cdk_context

ENVIRONMENTS = ("dev", "staging", "prod")
PULL = ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer")


class _Refs(dict[str, Any]):
    """Pseudo parameters; any other reference stands for itself (the pull statements name no resource of the stack)."""

    def __missing__(self, key: str) -> str:
        return f"<{key}>"


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_each_training_role_pulls_the_repository_of_its_image(templates, environment: str) -> None:
    settings = parse_environment(environment, cdk_context()["environments"][environment])
    foundation = templates[environment]["Foundation"]
    refs = _Refs({"AWS::Partition": "aws", "AWS::Region": settings.region, "AWS::AccountId": "123456789012",
                  "AWS::URLSuffix": "amazonaws.com"})  # fmt: skip
    dlc_account = region_info.Fact.find(settings.region, region_info.FactName.DLC_REPOSITORY_ACCOUNT)
    registry = f"arn:aws:ecr:{settings.region}:{dlc_account}:repository"
    for role, image, platform in (
        ("TrainingInstanceRole", settings.training.image, "ec2"),
        (
            f"RemoteJobRole{settings.training.remote_callers[0].capitalize()}",
            settings.training.remote_image,
            "sagemaker",
        ),
    ):
        policies = role_policies(foundation, logical_id(foundation, "AWS::IAM::Role", role), refs)
        for action in PULL:
            assert is_allowed(policies, Request(action, f"{registry}/{image.repository}")), (role, action)
        others = {fact.repository for fact in training_images(platform)} - {image.repository}  # type: ignore[arg-type]
        assert others, "the table keeps the replaced training images as history"
        for repository in others:
            request = Request("ecr:BatchGetImage", f"{registry}/{repository}")
            assert not is_allowed(policies, request), (role, repository)
        # Another account's repository of the same name is not AWS's image.
        assert not is_allowed(policies, Request("ecr:BatchGetImage", f"arn:aws:ecr:{settings.region}:111122223333:"
                                                f"repository/{image.repository}"))  # fmt: skip
