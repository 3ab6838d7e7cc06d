"""The pipeline source and the two environments the promotion pipeline's component tests promote through."""

from __future__ import annotations

from stacks.components.promotion_pipeline import PipelineSource, PromotionTarget

TOOLING, REGION = "999999999999", "us-west-2"
ACCOUNTS = {"dev": "111111111111", "prod": "333333333333"}
SOURCE = PipelineSource(
    region=REGION,
    repository="example-org/pytorch-platform",
    branch="main",
    connection_arn=f"arn:aws:codeconnections:{REGION}:{TOOLING}:connection/0123abcd-0123-4567-89ab-0123456789ab",
)

# cdk.json's "pipeline" settings for the same source and tooling account.
PIPELINE = {
    "account": TOOLING,
    "region": REGION,
    "connection_arn": SOURCE.connection_arn,
    "repository": SOURCE.repository,
    "branch": SOURCE.branch,
}


def targets() -> list[PromotionTarget]:
    return [PromotionTarget(name, REGION, account, "pytorch-platform") for name, account in ACCOUNTS.items()]
