"""`pytorch-platform check-images --env <env>`: before a deploy, is every image the environment's templates resolve at
deploy time there, of the architecture its instances run, and pullable by this account?

A stack that runs a platform-built image (the Graviton endpoint's serving image, the training image when
``training.image_registry_account`` is set) reads its digest URI from an SSM parameter when CloudFormation creates
the change set (a template parameter of type ``AWS::SSM::Parameter::Value<String>``). Three things fail the deploy,
none of which synth can see:

- the parameter is absent: CloudFormation refuses the change set ("Unable to fetch parameters ... from parameter
  store");
- the image is built for another architecture than the instance (an x86_64 image on ml.c7g): SageMaker fails
  CreateEndpoint after many minutes, the container never starts (exec format error);
- the repository is in another account and its policy does not let this account pull (ECR: both the repository
  policy and the puller's IAM policy must allow the pull, https://docs.aws.amazon.com/AmazonECR/latest/userguide/
  repository-policies.html): the endpoint fails when SageMaker pulls.

One line per image, exit status 1 when one fails. What each stack needs comes from the cloud assembly (``make synth``
first); the image's architecture from its manifest (ECR BatchGetImage: an image index lists each platform; a single
image's config blob holds ``architecture``, fetched through GetDownloadUrlForLayer).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops_review.review import StackTemplate, load_assembly
from platform_facts.instances import lookup as instance_facts

SSM_PARAMETER_TYPE = "AWS::SSM::Parameter::Value<String>"
# The CDK bootstrap's version parameter is the other SSM-typed parameter every template has.
_BOOTSTRAP_PREFIX = "/cdk-bootstrap/"
# <account>.dkr.ecr.<region>.<domain>/<repository>@sha256:<digest> (what the pipeline and docs/images.md write).
IMAGE_URI = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/(?P<repository>[a-z0-9._/-]+)"
    r"@(?P<digest>sha256:[0-9a-f]{64})$"
)
_INDEX_TYPES = {
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
}
PULL_ACTIONS = ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer")


@dataclass(frozen=True)
class ImageNeed:
    """An image one stack resolves from an SSM parameter when it deploys, and what runs it."""

    stack: str  # env/Stack, as cdk ls prints it
    parameter: str
    architecture: str | None  # arm64 / x86_64 of the instance type that runs it (None: type not in the facts)
    runs_on: str  # the instance type, or what uses the image


@dataclass(frozen=True)
class Result:
    ok: bool
    need: ImageNeed
    message: str

    def line(self) -> str:
        return f"{'OK ' if self.ok else 'FAIL'} {self.need.parameter} ({self.need.stack}): {self.message}"


def _refs(value: Any) -> set[str]:
    """The logical ids ``value`` refers to (Ref, Fn::GetAtt)."""
    if isinstance(value, dict):
        found = {value["Ref"]} if isinstance(value.get("Ref"), str) else set()
        attribute = value.get("Fn::GetAtt")
        if isinstance(attribute, list) and attribute and isinstance(attribute[0], str):
            found.add(attribute[0])
        return found.union(*(_refs(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_refs(v) for v in value))
    return set()


def image_needs(stacks: list[StackTemplate]) -> list[ImageNeed]:
    """Every (stack, image parameter) of the templates, with the architecture of the instances that run the image:
    a SageMaker model's image on its endpoint config's instance type, a launch template's on its instance type."""
    needs = []
    for stack in stacks:
        template = stack.template
        parameters = {
            logical_id: parameter["Default"]
            for logical_id, parameter in template.get("Parameters", {}).items()
            if parameter.get("Type") == SSM_PARAMETER_TYPE
            and not str(parameter.get("Default", "")).startswith(_BOOTSTRAP_PREFIX)
        }
        if not parameters:
            continue
        resources = template.get("Resources", {})
        for logical_id, name in parameters.items():
            types: set[str] = set()
            for model_id, model in resources.items():
                properties = model.get("Properties", {})
                if model["Type"] == "AWS::SageMaker::Model" and logical_id in _refs(properties.get("PrimaryContainer")):
                    types |= {
                        variant["InstanceType"]
                        for config in resources.values()
                        if config["Type"] == "AWS::SageMaker::EndpointConfig"
                        for variant in config["Properties"].get("ProductionVariants", [])
                        if model_id in _refs(variant.get("ModelName")) and isinstance(variant.get("InstanceType"), str)
                    }
                elif model["Type"] == "AWS::EC2::LaunchTemplate" and logical_id in _refs(properties):
                    instance_type = properties.get("LaunchTemplateData", {}).get("InstanceType")
                    if isinstance(instance_type, str):
                        types.add(instance_type)
            label = f"{stack.environment}/{stack.stack}"
            if not types:
                needs.append(ImageNeed(label, name, None, "no instance type in the template"))
            for instance_type in sorted(types):
                facts = instance_facts(instance_type)
                needs.append(ImageNeed(label, name, facts.architecture if facts else None, instance_type))
    return needs


def _code(error: Exception) -> str:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def pull_allowed(policy: dict[str, Any], account: str, partition: str = "aws") -> bool:
    """Whether a repository policy lets principals of ``account`` pull: an Allow of the pull actions to the account
    (its root, a principal ARN of that account, or ``*``) and no Deny that would cover it. Conditions on an Allow
    other than aws:PrincipalAccount / aws:SourceAccount naming the account are not assumed to hold."""

    def statements(effect: str) -> list[dict[str, Any]]:
        listed = policy.get("Statement", [])
        return [s for s in (listed if isinstance(listed, list) else [listed]) if s.get("Effect") == effect]

    def covers_actions(statement: dict[str, Any]) -> bool:
        actions = statement.get("Action", [])
        actions = [actions] if isinstance(actions, str) else actions
        return all(any(re.fullmatch(a.replace("*", ".*"), wanted, re.I) for a in actions) for wanted in PULL_ACTIONS)

    def names_account(statement: dict[str, Any]) -> bool:
        principal = statement.get("Principal", {})
        if principal == "*":
            return True
        listed = principal.get("AWS", []) if isinstance(principal, dict) else []
        listed = [listed] if isinstance(listed, str) else listed
        return any(p == "*" or p == account or re.match(rf"^arn:{partition}[\w-]*:iam::{account}:", p) for p in listed)

    def condition_holds(statement: dict[str, Any], deny: bool) -> bool:
        """Whether the statement's conditions hold for a principal of ``account`` (principal-account keys only;
        any other condition: assumed to hold for a Deny, not for an Allow)."""
        for operator, keys in statement.get("Condition", {}).items():
            for key, values in keys.items():
                values = [values] if isinstance(values, str) else values
                if key.lower() not in ("aws:principalaccount", "aws:sourceaccount"):
                    if not deny:
                        return False
                    continue
                if operator == "StringEquals" and account not in values:
                    return False
                if operator == "StringNotEquals" and account in values:
                    return False
        return True

    allowed = any(
        covers_actions(s) and names_account(s) and condition_holds(s, deny=False) for s in statements("Allow")
    )
    denied = any(
        names_account(s)
        and any(
            re.fullmatch(a.replace("*", ".*"), wanted, re.I)
            for a in _listed(s.get("Action"))
            for wanted in PULL_ACTIONS
        )
        and condition_holds(s, deny=True)
        for s in statements("Deny")
    )
    return allowed and not denied


def _listed(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def _architecture(name: str) -> str:
    """OCI's names (amd64, arm64) as the instance facts name them (x86_64, arm64)."""
    return {"amd64": "x86_64", "aarch64": "arm64"}.get(name, name)


def _fetch_blob(ecr: Any, registry: str, repository: str, digest: str) -> dict[str, Any]:
    """An image's config blob: ECR hands out a short-lived download URL for it (GetDownloadUrlForLayer)."""
    url = ecr.get_download_url_for_layer(registryId=registry, repositoryName=repository, layerDigest=digest)[
        "downloadUrl"
    ]
    with urllib.request.urlopen(url, timeout=30) as response:  # an https URL ECR just signed
        blob: dict[str, Any] = json.loads(response.read())
    return blob


BlobFetcher = Callable[[Any, str, str, str], dict[str, Any]]


class ImageCheck:
    """Checks each ImageNeed against the account: ``clients(service, region)`` makes the boto3 clients."""

    def __init__(self, clients: Callable[[str, str], Any], region: str, fetch_blob: BlobFetcher = _fetch_blob) -> None:
        self.client = clients
        self.region = region
        self.fetch_blob = fetch_blob
        self._account: str | None = None

    @property
    def account(self) -> str:
        if self._account is None:
            self._account = str(self.client("sts", self.region).get_caller_identity()["Account"])
        return self._account

    def check(self, need: ImageNeed) -> Result:
        ssm = self.client("ssm", self.region)
        try:
            value = ssm.get_parameter(Name=need.parameter)["Parameter"]["Value"]
        except Exception as error:
            if _code(error) != "ParameterNotFound":
                raise
            return Result(
                False,
                need,
                f"absent in {self.region}: CloudFormation refuses {need.stack}'s change set; "
                "publish the image and write the parameter (README, First deploy, step 2).",
            )
        uri = IMAGE_URI.match(value)
        if uri is None:
            return Result(
                False,
                need,
                f"holds {value!r}, not an ECR digest URI (<account>.dkr.ecr.<region>."
                "amazonaws.com/<repository>@sha256:<digest>): write the pushed image's digest URI.",
            )
        registry, region, repository = uri["account"], uri["region"], uri["repository"]
        ecr = self.client("ecr", region)
        if registry != self.account:
            problem = self._cross_account_pull(ecr, registry, repository)
            if problem:
                return Result(False, need, problem)
        manifest = self._manifest(ecr, registry, repository, uri["digest"])
        if isinstance(manifest, str):
            return Result(False, need, manifest.format(value=value))
        found = self._architectures(ecr, registry, repository, manifest)
        if need.architecture is None:
            return Result(
                True,
                need,
                f"{value} exists ({', '.join(sorted(found)) or 'architecture unknown'}); "
                f"{need.runs_on}'s architecture is not in the instance facts.",
            )
        if need.architecture not in found:
            return Result(
                False,
                need,
                f"{value} is built for {', '.join(sorted(found)) or 'an unknown architecture'}, "
                f"{need.runs_on} runs {need.architecture}: build it on {need.architecture} "
                "(the pipeline's image builds do) and write that digest.",
            )
        return Result(True, need, f"{value} exists, {need.architecture} as {need.runs_on} needs, pullable.")

    def _manifest(self, ecr: Any, registry: str, repository: str, digest: str) -> dict[str, Any] | str:
        """The image's manifest, or why it cannot be read (a sentence with a ``{value}`` field for the URI)."""
        try:
            response = ecr.batch_get_image(
                registryId=registry,
                repositoryName=repository,
                imageIds=[{"imageDigest": digest}],
                acceptedMediaTypes=[
                    "application/vnd.docker.distribution.manifest.v2+json",
                    "application/vnd.oci.image.manifest.v1+json",
                    *_INDEX_TYPES,
                ],
            )
        except Exception as error:
            if _code(error) in ("RepositoryNotFoundException", "AccessDeniedException"):
                return (
                    f"{registry}/{repository} cannot be read by account {self.account} ({_code(error)}): the "
                    "endpoint could not pull it."
                )
            raise
        if not response.get("images"):
            return (
                "{value} is not in its repository (the digest was deleted or never pushed): publish the image again "
                "and write its digest."
            )
        manifest: dict[str, Any] = json.loads(response["images"][0]["imageManifest"])
        return manifest

    def _cross_account_pull(self, ecr: Any, registry: str, repository: str) -> str | None:
        """Why this account cannot pull from another account's repository, or None when its policy allows it (or
        cannot be read: then BatchGetImage, which the caller tries next, answers)."""
        try:
            text = ecr.get_repository_policy(registryId=registry, repositoryName=repository)["policyText"]
        except Exception as error:
            code = _code(error)
            if code == "RepositoryPolicyNotFoundException":
                return (
                    f"repository {repository} of account {registry} has no policy, so account {self.account} "
                    f"cannot pull from it: add {self.account} to the pipeline's environments (its repository "
                    "policy names their accounts) or publish the image into this account."
                )
            if code == "RepositoryNotFoundException":
                return f"repository {repository} does not exist in account {registry}: publish the image first."
            if code == "AccessDeniedException":
                return None
            raise
        if pull_allowed(json.loads(text), self.account):
            return None
        return (
            f"the policy of repository {repository} (account {registry}) does not let account {self.account} "
            "pull: add this account to the pipeline's environments, or publish the image into this account."
        )

    def _architectures(self, ecr: Any, registry: str, repository: str, manifest: dict[str, Any]) -> set[str]:
        if manifest.get("mediaType") in _INDEX_TYPES or "manifests" in manifest:
            # An index lists every platform (attestation manifests carry os "unknown").
            return {
                _architecture(entry["platform"]["architecture"])
                for entry in manifest.get("manifests", [])
                if entry.get("platform", {}).get("os") not in (None, "unknown")
            }
        config = manifest.get("config", {}).get("digest")
        if not config:
            return set()
        blob = self.fetch_blob(ecr, registry, repository, config)
        return {_architecture(str(blob["architecture"]))} if blob.get("architecture") else set()


def check_images(
    cdk_out: Path, environment: str, clients: Callable[[str, str], Any], fetch_blob: BlobFetcher = _fetch_blob
) -> list[Result]:
    """One result per image the environment's stacks resolve at deploy time."""
    stacks = [stack for stack in load_assembly(cdk_out) if stack.environment == environment]
    if not stacks:
        raise ValueError(f"{cdk_out} has no stacks of {environment!r}; run `make synth` first.")
    region = next((stack.region for stack in stacks if stack.region), None) or "us-west-2"
    checker = ImageCheck(clients, region, fetch_blob)
    return [checker.check(need) for need in image_needs(stacks)]


def main(argv: list[str] | None = None, *, clients: Callable[[str, str], Any] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pytorch-platform check-images", description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True, help="the environment whose stacks' images to check")
    parser.add_argument("--cdk-out", type=Path, default=Path("cdk.out"), help="cloud assembly (default: cdk.out)")
    args = parser.parse_args(argv)
    if clients is None:
        import boto3

        session = boto3.session.Session()
        clients = lambda service, region: session.client(service, region_name=region)  # noqa: E731
    try:
        results = check_images(args.cdk_out, args.env, clients)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not results:
        print(f"{args.env}: no stack of this environment runs a platform-built image.")
    for result in results:
        print(result.line())
    return 0 if all(result.ok for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
