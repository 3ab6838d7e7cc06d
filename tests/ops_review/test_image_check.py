"""`pytorch-platform check-images` (issue 40, item 1): the images a stack resolves from SSM when it deploys are there,
of the architecture its instances run, and pullable by the account; run against moto's SSM, ECR and STS.

moto 5.2.5 does not implement ECR GetDownloadUrlForLayer, so a single-platform image's config blob (where its
architecture is written) comes from a fetcher given to the check, shaped as the OCI image config is
({"architecture": "arm64", "os": "linux", ...}); an image index's platforms come from moto's BatchGetImage.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import boto3
import pytest

from ops_review.image_check import ImageNeed, check_images, image_needs, main, pull_allowed
from ops_review.review import load_assembly

ACCOUNT = "123456789012"  # moto's default account: the caller
TOOLING = "999999999999"
PARAMETER = "/pytorch-platform/images/graviton-serving"
REPOSITORY = "pytorch-platform/graviton-serving"


@pytest.fixture(scope="module")
def assembly(cloud_assembly: Any) -> Path:
    return Path(cloud_assembly.directory)


def test_the_templates_say_which_image_runs_where(assembly: Path) -> None:
    """staging's Graviton endpoint resolves the serving image from SSM and runs it on ml.c7g (arm64); the
    bootstrap version parameter is not an image."""
    needs = image_needs([s for s in load_assembly(assembly) if s.environment == "staging"])
    assert needs == [ImageNeed("staging/GravitonEndpoint", PARAMETER, "arm64", "ml.c7g.xlarge")]
    assert image_needs([s for s in load_assembly(assembly) if s.environment == "dev"]) == []  # no endpoint yet


def _manifest(architecture: str) -> tuple[str, str]:
    """(manifest, its digest) of a single-platform image whose config blob says ``architecture``."""
    config = "sha256:" + hashlib.sha256(architecture.encode()).hexdigest()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 1, "digest": config},
            "layers": [],
        }
    )
    return manifest, "sha256:" + hashlib.sha256(manifest.encode()).hexdigest()


def _index(*architectures: str) -> tuple[str, str]:
    entries = [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1, "digest": "sha256:" + "a" * 64,
         "platform": {"architecture": a, "os": "linux"}} for a in architectures
    ] + [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1, "digest": "sha256:" + "b" * 64,
          "platform": {"architecture": "unknown", "os": "unknown"}}]  # fmt: skip
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                           "manifests": entries})  # fmt: skip
    return manifest, "sha256:" + hashlib.sha256(manifest.encode()).hexdigest()


def _configs(ecr: Any, registry: str, repository: str, digest: str) -> dict[str, Any]:
    architecture = next(a for a in ("arm64", "amd64") if "sha256:" + hashlib.sha256(a.encode()).hexdigest() == digest)
    return {"architecture": architecture, "os": "linux"}


def _publish(registry: str, manifest: tuple[str, str], policy: dict[str, Any] | None = None) -> str:
    """Create the repository (in ``registry``'s name), push the manifest, write the parameter; the digest URI."""
    ecr = boto3.client("ecr")
    ecr.create_repository(repositoryName=REPOSITORY, registryId=registry)
    if policy is not None:
        ecr.set_repository_policy(registryId=registry, repositoryName=REPOSITORY, policyText=json.dumps(policy))
    body, digest = manifest
    ecr.put_image(registryId=registry, repositoryName=REPOSITORY, imageManifest=body, imageTag="v1")
    pushed = ecr.batch_get_image(registryId=registry, repositoryName=REPOSITORY, imageIds=[{"imageTag": "v1"}])
    digest = pushed["images"][0]["imageId"]["imageDigest"]
    uri = f"{registry}.dkr.ecr.us-west-2.amazonaws.com/{REPOSITORY}@{digest}"
    boto3.client("ssm").put_parameter(Name=PARAMETER, Type="String", Value=uri, Overwrite=True)
    return uri


def _run(assembly: Path) -> list[str]:
    results = check_images(assembly, "staging", lambda service, region: boto3.client(service, region_name=region),
                           fetch_blob=_configs)  # fmt: skip
    return [result.line() for result in results]


def _pull_policy(*accounts: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "EnvironmentAccountsPull", "Effect": "Allow",
             "Principal": {"AWS": [f"arn:aws:iam::{a}:root" for a in accounts]},
             "Action": ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]},
            {"Sid": "DenyOutsideThePlatformAccounts", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "ecr:*",
             "Condition": {"StringNotEquals": {"aws:PrincipalAccount": [TOOLING, *accounts]}}},
        ],
    }  # fmt: skip


def test_an_absent_parameter_is_one_line(assembly: Path, mocked_aws: str) -> None:
    (line,) = _run(assembly)
    assert line == (
        f"FAIL {PARAMETER} (staging/GravitonEndpoint): absent in us-west-2: CloudFormation refuses "
        "staging/GravitonEndpoint's change set; publish the image and write the parameter (README, First deploy, "
        "step 2)."
    )


def test_an_x86_image_on_graviton_is_refused(assembly: Path, mocked_aws: str) -> None:
    uri = _publish(ACCOUNT, _manifest("amd64"))
    (line,) = _run(assembly)
    assert line.startswith(f"FAIL {PARAMETER}") and f"{uri} is built for x86_64, ml.c7g.xlarge runs arm64" in line


def test_an_arm64_image_of_this_account_passes(assembly: Path, mocked_aws: str) -> None:
    uri = _publish(ACCOUNT, _manifest("arm64"))
    assert _run(assembly) == [
        f"OK  {PARAMETER} (staging/GravitonEndpoint): {uri} exists, arm64 as ml.c7g.xlarge needs, pullable."
    ]


def test_an_index_is_read_by_its_platforms(assembly: Path, mocked_aws: str) -> None:
    _publish(ACCOUNT, _index("amd64"))
    (line,) = _run(assembly)
    assert "is built for x86_64, ml.c7g.xlarge runs arm64" in line  # the attestation's "unknown" is not a platform
    boto3.client("ecr").delete_repository(repositoryName=REPOSITORY, force=True)
    _publish(ACCOUNT, _index("amd64", "arm64"))
    assert _run(assembly)[0].startswith("OK ")


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (None, f"repository {REPOSITORY} of account {TOOLING} has no policy, so account {ACCOUNT} cannot pull"),
        (_pull_policy("111111111111"), f"does not let account {ACCOUNT} pull"),
        (_pull_policy(ACCOUNT), None),
    ],
)
def test_a_repository_of_another_account_must_name_this_one(
    assembly: Path, mocked_aws: str, policy: dict[str, Any] | None, expected: str | None
) -> None:
    _publish(TOOLING, _manifest("arm64"), policy)
    (line,) = _run(assembly)
    if expected is None:
        assert line.startswith("OK ")
    else:
        assert line.startswith("FAIL ") and expected in line


def test_pull_allowed_reads_the_pipelines_deny_as_well() -> None:
    """The pipeline's repository policy (image_builds) allows the environment accounts and denies every other."""
    assert pull_allowed(_pull_policy(ACCOUNT), ACCOUNT)
    assert not pull_allowed(_pull_policy("111111111111"), ACCOUNT)
    assert not pull_allowed({"Statement": []}, ACCOUNT)
    assert pull_allowed({"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "ecr:*"}]}, ACCOUNT)


def test_pull_allowed_needs_every_pull_action_for_this_account_and_no_deny_that_may_hold() -> None:
    """A pull needs all three actions; a principal of another account whose name holds this account's id is not this
    account; a Deny with a condition the review cannot evaluate (not the principal's account) is taken to hold."""
    pull = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]

    def allow(principal: object, actions: list[str]) -> dict[str, Any]:
        return {"Effect": "Allow", "Principal": principal, "Action": actions}

    assert pull_allowed({"Statement": [allow({"AWS": f"arn:aws:iam::{ACCOUNT}:role/builder"}, pull)]}, ACCOUNT)
    assert not pull_allowed({"Statement": [allow({"AWS": ACCOUNT}, ["ecr:BatchGetImage"])]}, ACCOUNT)
    impostor = f"arn:aws:iam::{TOOLING}:role/{ACCOUNT}-builder"
    assert not pull_allowed({"Statement": [allow({"AWS": impostor}, pull)]}, ACCOUNT)
    deny_plain_http = {"Effect": "Deny", "Principal": "*", "Action": "ecr:*",
                       "Condition": {"Bool": {"aws:SecureTransport": "false"}}}  # fmt: skip
    assert not pull_allowed({"Statement": [allow({"AWS": ACCOUNT}, pull), deny_plain_http]}, ACCOUNT)


def test_the_command_exits_1_on_a_failing_image(assembly: Path, mocked_aws: str, capsys: Any) -> None:
    clients = lambda service, region: boto3.client(service, region_name=region)  # noqa: E731
    assert main(["--env", "staging", "--cdk-out", str(assembly)], clients=clients) == 1
    assert capsys.readouterr().out.startswith(f"FAIL {PARAMETER}")
    assert main(["--env", "dev", "--cdk-out", str(assembly)], clients=clients) == 0
    assert "no stack of this environment runs a platform-built image" in capsys.readouterr().out
