"""PromotionPipeline on a bare stack, with two minimal stages (a bucket stack and an endpoint stack each): the
source connection, the synth step, the artifact bucket's key, the promotion order and the pre-deploy model check."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Capture, Match, Template
from constructs import Construct

from stacks.components.promotion_pipeline import (
    KEEP_LOGICAL_IDS,
    SYNTH_COMMANDS,
    ModelEndpoint,
    PromotionPipeline,
    PromotionStage,
    PromotionTarget,
)
from tests.stacks.components.promotion_targets import ACCOUNTS, REGION, SOURCE, TOOLING, targets

MODEL_KEY = "endpoints/sentiment/model-v1.tar.gz"


def _minimal_stage(scope: Construct, environment: PromotionTarget) -> PromotionStage:
    """A bucket stack and an endpoint stack that depends on it: what the pipeline needs of a real stage."""
    stage = cdk.Stage(scope, environment.name, env=cdk.Environment(account=environment.account, region=REGION))
    buckets = cdk.Stack(stage, "Buckets")
    cdk.CfnWaitConditionHandle(buckets, "Placeholder")
    bucket_name = cdk.CfnOutput(buckets, "BucketName", value="model-bucket")
    endpoint = cdk.Stack(stage, "Endpoint")
    cdk.CfnWaitConditionHandle(endpoint, "Placeholder")
    endpoint_name = cdk.CfnOutput(endpoint, "EndpointName", value=f"{environment.name}-endpoint")
    endpoint.add_dependency(buckets)
    return PromotionStage(
        stage,
        ModelEndpoint(stack=endpoint, model_key=MODEL_KEY, bucket_name=bucket_name, endpoint_name=endpoint_name),
    )


@pytest.fixture(scope="module")
def template() -> Template:
    stack = cdk.Stack(cdk.App(), "Bare", env=cdk.Environment(account=TOOLING, region=REGION))
    PromotionPipeline(stack, KEEP_LOGICAL_IDS, source=SOURCE, targets=targets(), stage_factory=_minimal_stage)
    return Template.from_stack(stack)


@pytest.fixture(scope="module")
def stages(template: Template) -> dict[str, list[dict[str, Any]]]:
    captured = Capture()
    template.has_resource_properties("AWS::CodePipeline::Pipeline", {"Stages": captured})
    return {stage["Name"]: stage["Actions"] for stage in captured.as_array()}


def test_source_is_the_configured_connection(template: Template) -> None:
    template.has_resource_properties(
        "AWS::CodePipeline::Pipeline",
        {
            "Stages": Match.array_with(
                [
                    Match.object_like(
                        {
                            "Name": "Source",
                            "Actions": [
                                Match.object_like(
                                    {
                                        "ActionTypeId": Match.object_like({"Provider": "CodeStarSourceConnection"}),
                                        "Configuration": {
                                            "ConnectionArn": SOURCE.connection_arn,
                                            "FullRepositoryId": SOURCE.repository,
                                            "BranchName": SOURCE.branch,
                                        },
                                    }
                                )
                            ],
                        }
                    )
                ]
            )
        },
    )


def test_synth_runs_make_test_then_make_synth_and_outputs_cdk_out(template: Template) -> None:
    assert SYNTH_COMMANDS == ("make test", "make synth")
    template.has_resource_properties(
        "AWS::CodeBuild::Project",
        {
            "Source": Match.object_like(
                {
                    "BuildSpec": Match.serialized_json(
                        Match.object_like(
                            {
                                "phases": Match.object_like(
                                    {
                                        "install": Match.object_like({"runtime-versions": {"python": "3.11"}}),
                                        "build": {"commands": ["make test", "make synth"]},
                                    }
                                ),
                                "artifacts": Match.object_like({"base-directory": "cdk.out"}),
                            }
                        )
                    )
                }
            )
        },
    )


def test_artifact_bucket_is_encrypted_with_the_pipeline_key(template: Template) -> None:
    (key_id,) = template.find_resources("AWS::KMS::Key", {"Properties": {"EnableKeyRotation": True}})
    key_arn = {"Fn::GetAtt": [key_id, "Arn"]}
    bucket = Capture()
    template.has_resource_properties(
        "AWS::CodePipeline::Pipeline",
        {"ArtifactStore": {"Type": "S3", "Location": {"Ref": bucket}, "EncryptionKey": {"Id": key_arn, "Type": "KMS"}}},
    )
    artifacts = template.find_resources("AWS::S3::Bucket")[bucket.as_string()]
    assert artifacts["DeletionPolicy"] == "Retain"
    assert artifacts["Properties"]["BucketEncryption"] == {
        "ServerSideEncryptionConfiguration": [
            {
                "BucketKeyEnabled": True,
                "ServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key_arn},
            }
        ]
    }


def test_stages_follow_synth_and_self_mutation_in_promotion_order(stages: dict[str, Any]) -> None:
    assert list(stages) == ["Source", "Build", "UpdatePipeline", "dev", "prod"]
    (approval,) = [a for a in stages["prod"] if a["ActionTypeId"]["Category"] == "Approval"]
    assert approval["RunOrder"] == 1, "prod waits for the approval before anything else"
    assert not any(a["ActionTypeId"]["Category"] == "Approval" for a in stages["dev"])


@pytest.mark.parametrize("environment", list(ACCOUNTS))
def test_model_check_runs_after_the_bucket_and_before_the_endpoint_deploys(
    environment: str, stages: dict[str, Any]
) -> None:
    actions = stages[environment]
    orders = {a["Name"]: a["RunOrder"] for a in actions}
    (check,) = [name for name in orders if name.endswith(f"ModelCheck-{environment}")]
    assert orders["Buckets.Deploy"] < orders[check] < orders["Endpoint.Prepare"] < orders["Endpoint.Deploy"]
    # Every stage it deploys is smoke-tested after its endpoint, prod included (rollouts that undo themselves).
    (smoke,) = [name for name in orders if name.startswith("SmokeTest")]
    assert orders[smoke] > orders["Endpoint.Deploy"]


def test_targets_outside_the_pipeline_region_are_refused() -> None:
    moved = targets()
    moved[1] = PromotionTarget(moved[1].name, "eu-west-1", moved[1].account, moved[1].project)
    with pytest.raises(ValueError, match=r"the pipeline deploys within us-west-2, not \['eu-west-1'\]"):
        PromotionPipeline(
            cdk.Stack(cdk.App(), "Bare"), KEEP_LOGICAL_IDS, source=SOURCE, targets=moved, stage_factory=_minimal_stage
        )
