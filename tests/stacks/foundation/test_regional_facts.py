"""Regions whose DLC registry account CDK does not know still synthesize, with the documented account."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from app import build_app
from tests.conftest import cdk_context


@pytest.mark.parametrize(("region", "account"), [("af-south-1", "626614931356"), ("il-central-1", "780543022126")])
def test_dlc_images_and_pull_permissions_use_the_regions_registry_account(
    tmp_path: Path, region: str, account: str
) -> None:
    context = cdk_context(env="dev")
    context["environments"] = copy.deepcopy(context["environments"])
    context["environments"]["dev"]["region"] = region
    (stage,) = build_app(context=context, outdir=str(tmp_path)).synth().nested_assemblies
    templates = {s.hierarchical_id.split("/")[-1]: s.template for s in stage.nested_assembly.stacks}
    # The multi-model endpoint runs a DLC (DJL Serving); the Graviton endpoint runs the platform's own image.
    endpoint = templates["MultiModelEndpoint"]
    (model,) = (r for r in endpoint["Resources"].values() if r["Type"] == "AWS::SageMaker::Model")
    assert model["Properties"]["PrimaryContainer"]["Image"].startswith(f"{account}.dkr.ecr.{region}.amazonaws.com/")
    # The image grants its own pull, in the endpoint stack (DlcImage.bind).
    assert f"arn:aws:ecr:{region}:{account}:repository/djl-inference" in str(endpoint)
