"""The Training stack's side of multi-node runs: the settings reach the instance (the bound, restarts, checkpoints,
the fixed global batch, NVMe), the pipeline-built image is pulled by digest with a grant scoped to its repository,
and the instance role may make every S3 call the checkpoint sync makes and nothing wider. Evaluated with the
project's IAM evaluator (ops_review/iam_policy.py) against the synthesized policies."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from ops_review.iam_policy import Request, is_allowed, resolve
from proving_ground.iam_requests import Call, logical_id, requests_for

REGISTRY = "999999999999"
ACCOUNT, REGION = "123456789012", "us-west-2"


@pytest.fixture(scope="module")
def pipeline_image_templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """dev with two nodes and the pipeline-built image, synthesized with the compliance gates (cdk-nag, ...)."""
    from app import build_app
    from tests.conftest import cdk_context

    context = cdk_context()
    environments = copy.deepcopy(context["environments"])
    environments["dev"]["training"].update(image_registry_account=REGISTRY, nodes=2)
    outdir = tmp_path_factory.mktemp("cdk.out")
    assembly = build_app(context={**context, "environments": environments, "env": "dev"}, outdir=str(outdir)).synth()
    (stage,) = assembly.nested_assemblies
    return {stack.hierarchical_id.split("/")[-1]: stack.template for stack in stage.nested_assembly.stacks}


def _user_data(template: dict[str, Any]) -> list[Any]:
    (resource,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    return resource["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]


def test_every_node_gets_the_pipeline_images_digest_from_its_parameter(pipeline_image_templates) -> None:
    training = pipeline_image_templates["Training"]
    parts = _user_data(training)
    index = parts.index(next(p for p in parts if isinstance(p, str) and p.endswith("export TRAINING_IMAGE_URI=")))
    reference = parts[index + 1]
    (name,) = [key for key, value in training["Parameters"].items() if {"Ref": key} == reference]
    # Resolved when the stack deploys: one launch-template version, one digest for every node it starts.
    assert training["Parameters"][name] == {"Type": "AWS::SSM::Parameter::Value<String>",
                                             "Default": "/pytorch-platform/images/training"}  # fmt: skip
    text = "".join(p if isinstance(p, str) else "<ref>" for p in parts)
    assert "export LOCAL_NVME=true" in text and "--global-batch-size 256 " in text  # 2 nodes: 16 per GPU


def test_the_instance_role_may_pull_the_training_image_and_no_other(pipeline_image_templates) -> None:
    training = pipeline_image_templates["Training"]
    (policy,) = [r["Properties"] for name, r in training["Resources"].items()
                 if r["Type"] == "AWS::IAM::Policy" and name.startswith("InstanceRoleForImagePullsPolicy")]  # fmt: skip
    (role,) = policy["Roles"]
    assert re.fullmatch(r"dev-Foundation:ExportsOutputRefTrainingInstanceRole\w+", role["Fn::ImportValue"])
    document = [resolve(policy["PolicyDocument"], refs={"AWS::Partition": "aws", "AWS::Region": REGION})]
    repository = f"arn:aws:ecr:{REGION}:{REGISTRY}:repository/pytorch-platform/training"
    for action in ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"):
        assert is_allowed(document, Request(action, repository))
        assert not is_allowed(document, Request(action, repository.replace("/training", "/graviton-serving")))
    assert is_allowed(document, Request("ecr:GetAuthorizationToken", "*"))
    assert not is_allowed(document, Request("ecr:PutImage", repository))


class _Refs(dict):  # type: ignore[type-arg]
    """Template references by logical id; buckets and the key get ARNs, anything else a placeholder."""

    def __missing__(self, key: str) -> str:
        return f"<{key}>"


def test_the_instance_role_allows_every_call_of_the_checkpoint_sync(templates) -> None:
    """What checkpoint_sync.py, run_lineage.py and ec2_run.sh do with the run's prefix, as the instance's session
    (aws:userid <role id>:<instance id>): list the launch records and read them, list the writers' folders (is the
    run finished?), read an earlier writer's markers and files (resume), write files and markers into its own folder
    SSE-KMS with the platform key."""
    foundation = templates["dev"]["Foundation"]
    role_id = logical_id(foundation, "AWS::IAM::Role", "TrainingInstanceRole")
    bucket_id = logical_id(foundation, "AWS::S3::Bucket", "Artifacts")
    key_id = logical_id(foundation, "AWS::KMS::Key", "PlatformKey")
    key_arn = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/platform"
    refs = _Refs({"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::URLSuffix":
                  "amazonaws.com", bucket_id: "artifacts", f"{bucket_id}.Arn": "arn:aws:s3:::artifacts",
                  f"{key_id}.Arn": key_arn})  # fmt: skip
    policies = [
        resolve(resource["Properties"]["PolicyDocument"], refs=refs)
        for resource in foundation["Resources"].values()
        if resource["Type"] == "AWS::IAM::ManagedPolicy" and {"Ref": role_id} in resource["Properties"].get("Roles", [])
    ]
    run, session, earlier = "training-output/r-0123", "AROAINSTANCE:i-0new", "AROAINSTANCE:i-0old"
    mine = f"{run}/nodes/{session}"
    write = {
        "Key": f"{mine}/checkpoints/slot-1/optimizer.pt",
        "ServerSideEncryption": "aws:kms",
        "SSEKMSKeyId": key_arn,
    }
    calls = [
        ("ListObjectsV2", {"Bucket": "artifacts", "Prefix": f"{run}/launches/"}),
        ("GetObject", {"Bucket": "artifacts", "Key": f"{run}/launches/r-0123.json"}),
        ("ListObjectsV2", {"Bucket": "artifacts", "Prefix": f"{run}/nodes/"}),
        ("ListObjectsV2", {"Bucket": "artifacts", "Prefix": f"{run}/nodes/{earlier}/checkpoints/"}),
        (
            "GetObject",
            {"Bucket": "artifacts", "Key": f"{run}/nodes/{earlier}/checkpoints/slot-0/checkpoint-complete.json"},
        ),
        ("PutObject", {"Bucket": "artifacts", **write}),
    ]
    for operation, params in calls:
        call = Call("s3", operation, params, REGION, ACCOUNT)
        for request in requests_for(call, kms_encrypted_buckets={"artifacts": key_arn}):
            as_session = Request(request.action, request.resource, {**request.context, "aws:userid": session})
            assert is_allowed(policies, as_session), (operation, request)
    # Not the prefixes endpoints serve from.
    served = Call("s3", "PutObject", {"Bucket": "artifacts", "Key": "endpoints/x/checkpoint-complete.json"}, REGION,
                  ACCOUNT)  # fmt: skip
    assert not all(is_allowed(policies, r) for r in requests_for(served, kms_encrypted_buckets={}))


def test_the_checkpoint_sync_runs_on_the_hosts_python() -> None:
    """The host (DLAMI Ubuntu 22.04: Python 3.10, no torch) runs checkpoint_sync.py and the barrier module before
    any container starts: standard library imports only."""
    root = Path(__file__).resolve().parents[2] / "training_assets" / "instance"
    for name in ("checkpoint_sync.py", "rendezvous.py", "run_lineage.py"):
        imports = re.findall(r"^(?:from|import) ([\w.]+)", (root / name).read_text(), flags=re.MULTILINE)
        heavy = ("torch", "transformers", "training_assets", "boto3", "datasets")
        assert not [module for module in imports if module.split(".")[0] in heavy], (name, imports)
