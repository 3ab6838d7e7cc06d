"""`pytorch-platform preflight`: quotas, the zone's offering, the model object, key, buckets and fixed names.

moto models EC2 (instance types, zone offerings, subnets), S3, KMS, CloudWatch Logs and SSM: those run against it.
Service Quotas (moto 5.2.5 knows only the `vpc` service's quotas) and CloudFormation (moto's needs every moto extra)
answer from botocore Stubbers with responses shaped as the API references document them (GetServiceQuota,
ListServiceQuotas: Quota{ServiceCode, QuotaCode, QuotaName, Value, Unit, Adjustable, GlobalQuota}; DescribeStacks).
The SageMaker quota codes below are placeholders: the real ones differ per instance type, which is why preflight
finds SageMaker quotas by name.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.stub import Stubber
from moto import mock_aws

from ops_review import preflight
from ops_review.preflight import Needs, Preflight, capacity_target, ec2_vcpu_quota, needs_of
from stacks.settings import parse_environment
from tests.conftest import cdk_context as load_cdk_context

NO_SUCH_STACK = "Stack with id {} does not exist"


@pytest.fixture(scope="module")
def assembly(cloud_assembly: Any) -> Path:
    return Path(cloud_assembly.directory)


# What the checks below are played on, whatever cdk.json asks: a two-node p4d run (and @remote jobs on its SageMaker
# twin), a Graviton endpoint of up to 4 ml.c7g.4xlarge serving a named model, a multi-model endpoint of up to 6
# ml.c5.9xlarge. The stacks, subnets and names come from the environment's templates.
SCENARIO: dict[str, Any] = {
    "training_type": "p4d.24xlarge",
    "nodes": 2,
    "remote_type": "ml.p4d.24xlarge",
    "endpoint_maxima": {"ml.c7g.4xlarge": 4, "ml.c5.9xlarge": 6},
    "model_key": "endpoints/sentiment/model-v1.tar.gz",
}


def _needs(assembly: Path, environment: str = "staging", **changes: Any) -> Needs:
    return replace(needs_of(assembly, environment), **{**SCENARIO, **changes})


def _quota(service: str, code: str, name: str, value: float) -> dict[str, Any]:
    return {"ServiceCode": service, "ServiceName": service, "QuotaArn": f"arn:aws:servicequotas:::{service}/{code}",
            "QuotaCode": code, "QuotaName": name, "Value": value, "Unit": "None", "Adjustable": True,
            "GlobalQuota": False}  # fmt: skip


class Account:
    """moto for what it models, Stubbers for Service Quotas and CloudFormation; ``client`` is what preflight gets."""

    def __init__(self, region: str, endpoint_zones: list[str] | None = None) -> None:
        self.region = region
        self.session = boto3.session.Session(region_name=region)
        self.quotas = self.session.client("service-quotas")
        self.cloudformation = self.session.client("cloudformation")
        self.stubs = {"service-quotas": Stubber(self.quotas), "cloudformation": Stubber(self.cloudformation)}
        for stub in self.stubs.values():
            stub.activate()
        # moto's DescribeVpcEndpointServices loads every moto backend (and their extras); EC2 answers it here as the
        # EC2 API reference documents it (ServiceDetails[].ServiceName, AvailabilityZones), every other EC2 call
        # goes to moto. Default: every service offered in the region's zones a, b, c, d.
        self.endpoint_zones = endpoint_zones or [f"{region}{z}" for z in "abcd"]
        self.ec2 = self.session.client("ec2")
        self.asked: list[str] = []
        self.ec2.meta.events.register("before-parameter-build.ec2.DescribeVpcEndpointServices", self._ask)
        self.ec2.meta.events.register("before-call.ec2.DescribeVpcEndpointServices", self._endpoint_services)

    def _ask(self, params: dict[str, Any], **_: Any) -> None:
        self.asked = list(params.get("ServiceNames", []))

    def _endpoint_services(self, **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        details = [{"ServiceName": name, "ServiceType": [{"ServiceType": "Interface"}],
                    "AvailabilityZones": self.endpoint_zones} for name in self.asked]  # fmt: skip
        parsed = {"ServiceDetails": details, "ServiceNames": self.asked}
        return AWSResponse("https://ec2.amazonaws.com/", 200, {}, None), parsed

    def client(self, name: str) -> Any:
        return {"service-quotas": self.quotas, "cloudformation": self.cloudformation, "ec2": self.ec2}.get(
            name
        ) or self.session.client(name)

    def stacks(self, deployed: dict[str, dict[str, str]], names: list[str]) -> None:
        """DescribeStacks answers, in call order: ``deployed`` name -> outputs; any other name does not exist."""
        for name in names:
            if name in deployed:
                outputs = [{"OutputKey": k, "OutputValue": v} for k, v in deployed[name].items()]
                stack = {"StackName": name, "CreationTime": "2026-12-01T00:00:00Z", "StackStatus": "CREATE_COMPLETE",
                         "Outputs": outputs}  # fmt: skip
                self.stubs["cloudformation"].add_response("describe_stacks", {"Stacks": [stack]}, {"StackName": name})
            else:
                self.stubs["cloudformation"].add_client_error(
                    "describe_stacks",
                    "ValidationError",
                    NO_SUCH_STACK.format(name),
                    expected_params={"StackName": name},
                )

    def ec2_quota(self, code: str, value: float | None, default: float = 0.0) -> None:
        """GetServiceQuota; None: never changed (NoSuchResourceException), then the default answers."""
        params = {"ServiceCode": "ec2", "QuotaCode": code}
        if value is None:
            self.stubs["service-quotas"].add_client_error("get_service_quota", "NoSuchResourceException",
                                                          expected_params=params)  # fmt: skip
            answer = {"Quota": _quota("ec2", code, "Running On-Demand P instances", default)}
            self.stubs["service-quotas"].add_response("get_aws_default_service_quota", answer, params)
        else:
            answer = {"Quota": _quota("ec2", code, "Running On-Demand P instances", value)}
            self.stubs["service-quotas"].add_response("get_service_quota", answer, params)

    def sagemaker_quotas(self, applied: dict[str, float], defaults: dict[str, float] | None = None) -> None:
        def listed(values: dict[str, float]) -> dict[str, Any]:
            return {"Quotas": [_quota("sagemaker", f"L-{i:08X}", name, value)
                               for i, (name, value) in enumerate(values.items())]}  # fmt: skip

        self.stubs["service-quotas"].add_response("list_service_quotas", listed(applied), {"ServiceCode": "sagemaker"})
        if defaults is not None:
            self.stubs["service-quotas"].add_response("list_aws_default_service_quotas", listed(defaults),
                                                      {"ServiceCode": "sagemaker"})  # fmt: skip


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield


def _levels(findings: list[preflight.Finding]) -> dict[str, str]:
    return {f.check: f.level for f in findings}


SERVING_PARAMETER = "/pytorch-platform/images/graviton-serving"


def _publish_serving_image(region: str, architecture: str = "arm64") -> str:
    """README's first-deploy step 2 in moto: the serving image (an index of one platform) in this account's ECR and
    its digest URI in the parameter the Graviton endpoint resolves."""
    ecr = boto3.client("ecr", region_name=region)
    repository = "pytorch-platform/graviton-serving"
    if not ecr.describe_repositories()["repositories"]:
        ecr.create_repository(repositoryName=repository)
    elif ecr.list_images(repositoryName=repository, filter={"tagStatus": "TAGGED"})["imageIds"]:
        ecr.batch_delete_image(repositoryName=repository, imageIds=[{"imageTag": architecture}])
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1, "digest": "sha256:" + "a" * 64,
         "platform": {"architecture": architecture, "os": "linux"}}]})  # fmt: skip
    ecr.put_image(repositoryName=repository, imageManifest=manifest, imageTag=architecture)
    (image,) = ecr.batch_get_image(repositoryName=repository, imageIds=[{"imageTag": architecture}])["images"]
    account = boto3.client("sts", region_name=region).get_caller_identity()["Account"]
    uri = f"{account}.dkr.ecr.{region}.amazonaws.com/{repository}@{image['imageId']['imageDigest']}"
    ssm = boto3.client("ssm", region_name=region)
    ssm.put_parameter(Name=SERVING_PARAMETER, Type="String", Value=uri, Overwrite=True)
    return uri


def _first_deploy(account: Account, needs: Needs) -> None:
    """Quota answers that fit the needs; nothing deployed but the images (README, First deploy, step 2)."""
    if any(s.stack == "GravitonEndpoint" for s in needs.stacks):
        _publish_serving_image(needs.region)
    account.stacks({}, [needs.foundation_stack])
    account.ec2_quota("L-417A185B", 384.0)
    quotas = {f"{t} for endpoint usage": 20.0 for t in needs.endpoint_maxima}
    account.sagemaker_quotas({**quotas, f"{needs.remote_type} for training job usage": 1.0})


def test_the_needs_come_from_the_synthesized_templates(assembly: Path) -> None:
    """What cdk.json asks of staging (a Graviton endpoint: it names a model) and dev (none), read back from the
    templates."""
    wanted = {name: parse_environment(name, load_cdk_context()["environments"][name]) for name in ("staging", "dev")}
    staging, settings = needs_of(assembly, "staging"), wanted["staging"]
    assert (staging.training_type, staging.nodes, staging.zone_index, staging.zones) == (
        settings.training.instance_type,
        settings.training.nodes,
        settings.training.subnet_index,
        settings.vpc.max_azs,
    )
    assert staging.remote_type == settings.training.remote_instance_type
    graviton, multi_model = settings.graviton_endpoint, settings.multi_model_endpoint
    assert staging.endpoint_maxima == {
        graviton.instance_type: graviton.autoscaling.max_capacity,
        multi_model.instance_type: multi_model.autoscaling.max_capacity,
    }
    assert staging.model_key == graviton.model_data_key
    assert staging.model_key is not None
    dev, settings = needs_of(assembly, "dev"), wanted["dev"]
    multi_model = settings.multi_model_endpoint
    assert (dev.nodes, dev.model_key, dev.endpoint_maxima) == (
        settings.training.nodes,
        settings.graviton_endpoint.model_data_key,
        {multi_model.instance_type: multi_model.autoscaling.max_capacity},
    )
    assert dev.model_key is None


def test_quota_codes_by_family() -> None:
    assert ec2_vcpu_quota("p4d.24xlarge") == ("L-417A185B", "Running On-Demand P instances")
    assert ec2_vcpu_quota("p5.48xlarge")[0] == "L-417A185B"
    assert ec2_vcpu_quota("g5.12xlarge")[0] == "L-DB2E81BA"
    assert ec2_vcpu_quota("trn1.32xlarge")[0] == "L-2C3B7624"
    assert ec2_vcpu_quota("inf2.48xlarge")[0] == "L-1945791B"
    assert ec2_vcpu_quota("c7g.xlarge")[0] == "L-1216C47A"


def test_a_new_account_is_blocked_by_its_zero_quotas_with_the_request_to_make(aws: None, assembly: Path) -> None:
    needs = _needs(assembly)
    account = Account(needs.region)
    account.stacks({}, ["staging-Foundation"])
    account.ec2_quota("L-417A185B", None, default=0.0)  # never raised: the default answers
    account.sagemaker_quotas(
        {"ml.c7g.4xlarge for endpoint usage": 2.0},
        defaults={"ml.p4d.24xlarge for training job usage": 0.0, "ml.c5.9xlarge for endpoint usage": 6.0},
    )
    findings = Preflight(needs, account.client).run()
    lines = [f.line() for f in findings]

    levels = _levels(findings)
    assert levels["EC2 quota L-417A185B (Running On-Demand P instances)"] == "BLOCKER"
    (ec2,) = [line for line in lines if "L-417A185B" in line]
    assert "a 2-node p4d.24xlarge run needs 192 vCPUs" in ec2 and "--desired-value 192" in ec2
    assert levels["SageMaker quota 'ml.p4d.24xlarge for training job usage'"] == "BLOCKER"
    (endpoint,) = [line for line in lines if "ml.c7g.4xlarge for endpoint usage" in line]
    assert endpoint.startswith("BLOCKER") and "autoscaling maximum of 4 needs 4" in endpoint
    assert levels["SageMaker quota 'ml.c5.9xlarge for endpoint usage'"] == "OK"  # 6 of 6
    assert levels["p4d.24xlarge in us-west-2a"] == "OK"
    assert levels["Graviton endpoint model"] == "WARNING"  # no Foundation yet: looked up after its deploy
    for stub in account.stubs.values():
        stub.assert_no_pending_responses()


def test_a_zone_without_the_type_names_the_subnet_index_that_has_it(aws: None, assembly: Path) -> None:
    """prod has three private subnets; moto offers p4d.24xlarge in eu-west-1 only in eu-west-1c."""
    needs = _needs(assembly, "prod", region="eu-west-1")
    account = Account("eu-west-1")
    _first_deploy(account, needs)
    (finding,) = [f for f in Preflight(needs, account.client).run() if f.check.startswith("p4d.24xlarge in")]
    assert finding.line() == (
        "BLOCKER  p4d.24xlarge in eu-west-1a: not offered in the zone of training.subnet_index 0: set "
        "training.subnet_index to 2 (eu-west-1c)."
    )
    narrow = _needs(assembly, "staging", region="eu-west-1")  # two private subnets: a and b
    account = Account("eu-west-1")
    _first_deploy(account, narrow)
    (finding,) = [f for f in Preflight(narrow, account.client).run() if f.check.startswith("p4d.24xlarge in")]
    assert "none of the region's zones, as Fn::GetAZs lists them offers it" in finding.message


def _deployed_foundation(region: str) -> dict[str, str]:
    """A deployed Foundation in moto: key, buckets, private subnets; returns its outputs."""
    session = boto3.session.Session(region_name=region)
    s3, ec2 = session.client("s3"), session.client("ec2")
    key = session.client("kms").create_key()["KeyMetadata"]["Arn"]
    outputs = {"PlatformKeyArn": key}
    for output in ("DatasetsBucketName", "ArtifactsBucketName", "RemoteJobsBucketName", "AccessLogsBucketName"):
        bucket = f"staging-{output.removesuffix('BucketName').lower()}-0123"
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
        outputs[output] = bucket
    vpc = ec2.create_vpc(CidrBlock="10.41.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.41.{i}.0/24", AvailabilityZone=f"{region}{zone}")
               ["Subnet"]["SubnetId"] for i, zone in enumerate("ba")]  # fmt: skip
    outputs["PrivateSubnetIds"] = ",".join(subnets)
    return outputs


def test_with_the_foundation_deployed_the_model_key_and_buckets_are_checked(aws: None, assembly: Path) -> None:
    needs = _needs(assembly)
    outputs = _deployed_foundation(needs.region)
    account = Account(needs.region)
    account.stacks({"staging-Foundation": outputs}, ["staging-Foundation"])
    account.ec2_quota("L-417A185B", 384.0)
    account.sagemaker_quotas({"ml.p4d.24xlarge for training job usage": 1.0, "ml.c7g.4xlarge for endpoint usage": 4.0,
                              "ml.c5.9xlarge for endpoint usage": 6.0})  # fmt: skip
    boto3.client("s3", region_name=needs.region).delete_bucket(Bucket=outputs["RemoteJobsBucketName"])

    findings = Preflight(needs, account.client).run()
    levels = _levels(findings)
    # The training subnet is the Foundation's first private subnet, here in zone b.
    assert levels["p4d.24xlarge in us-west-2b"] == "OK"
    assert levels["platform key"] == "OK"
    assert levels[f"bucket {outputs['ArtifactsBucketName']}"] == "OK"
    assert levels[f"bucket {outputs['RemoteJobsBucketName']}"] == "BLOCKER"
    (model,) = [f for f in findings if f.check == "Graviton endpoint model"]
    assert model.level == "BLOCKER"
    assert model.message.startswith(f"s3://{outputs['ArtifactsBucketName']}/endpoints/sentiment/model-v1.tar.gz does")

    boto3.client("s3", region_name=needs.region).put_object(
        Bucket=outputs["ArtifactsBucketName"], Key="endpoints/sentiment/model-v1.tar.gz", Body=b"archive"
    )
    key_id = outputs["PlatformKeyArn"].rsplit("/", 1)[-1]
    boto3.client("kms", region_name=needs.region).schedule_key_deletion(KeyId=key_id, PendingWindowInDays=7)
    account = Account(needs.region)
    account.stacks({"staging-Foundation": outputs}, ["staging-Foundation"])
    account.ec2_quota("L-417A185B", 384.0)
    account.sagemaker_quotas({"ml.p4d.24xlarge for training job usage": 1.0, "ml.c7g.4xlarge for endpoint usage": 4.0,
                              "ml.c5.9xlarge for endpoint usage": 6.0})  # fmt: skip
    findings = Preflight(needs, account.client).run()
    levels = _levels(findings)
    assert levels["Graviton endpoint model"] == "OK"
    (key,) = [f for f in findings if f.check == "platform key"]
    assert key.level == "BLOCKER" and "PendingDeletion: cancel the deletion" in key.message


def test_a_log_group_a_new_stack_would_create_blocks_its_deploy(aws: None, assembly: Path) -> None:
    """Staging keeps its endpoint log groups when its stacks are destroyed: deploying again would fail."""
    needs = _needs(assembly)
    boto3.client("logs", region_name=needs.region).create_log_group(
        logGroupName="/aws/sagemaker/Endpoints/staging-GravitonEndpoint"
    )
    account = Account(needs.region)
    _first_deploy(account, needs)
    account.stacks({}, [s.stack_name for s in needs.stacks])
    findings = Preflight(needs, account.client).run()
    blockers = [f.line() for f in findings if f.level == "BLOCKER"]
    assert blockers == [
        "BLOCKER  log group /aws/sagemaker/Endpoints/staging-GravitonEndpoint: exists, and staging-GravitonEndpoint "
        "creates it: delete it (aws logs delete-log-group --log-group-name "
        "/aws/sagemaker/Endpoints/staging-GravitonEndpoint), after exporting what you keep."
    ]


def test_the_command_exits_1_on_a_blocker_and_takes_cdks_context_flag(
    aws: None, assembly: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    needs = needs_of(assembly, "dev")
    account = Account(needs.region)
    account.stacks({}, ["dev-Foundation"])
    account.ec2_quota("L-417A185B", 0.0)
    account.sagemaker_quotas({"ml.p4d.24xlarge for training job usage": 1.0, "ml.c5.2xlarge for endpoint usage": 2.0})
    account.stacks({}, [s.stack_name for s in needs.stacks])
    account.stacks({}, [stack for _, stack, _ in needs.elastic_ips])
    code = preflight.main(["-c", "env=dev", "--cdk-out", str(assembly)], clients=account.client)
    out = capsys.readouterr().out
    assert code == 1
    # The P quota, and the Elastic IPs: cdk.json's three environments name no account, so they share one, and
    # their 1 + 2 + 3 NAT gateways need six addresses against moto's (and a new account's) five.
    assert out.splitlines()[-1] == "dev: 2 blocker(s), 0 warning(s)"
    assert "BLOCKER  Elastic IPs (NAT gateways): 5 allowed, 0 in use; " in out and "(dev 1, staging 2, prod 3)" in out
    assert all(line.split()[0] in ("OK", "WARNING", "BLOCKER") for line in out.splitlines()[:-1])
    assert preflight.main(["-c", "env=qa", "--cdk-out", str(assembly)], clients=account.client) == 2


# --- capacity bought ahead: moto 5.2.5 does not model Capacity Reservations, so EC2 answers from a Stubber with
# responses shaped as the EC2 API reference documents DescribeCapacityReservations (the Stubber validates them
# against botocore's model): CapacityReservation{CapacityReservationId, InstanceType, AvailabilityZone,
# TotalInstanceCount, AvailableInstanceCount, State, StartDate, EndDate, ReservationType}.

RESERVATION = "cr-0123456789abcdef0"


def _reservation(**changes: Any) -> dict[str, Any]:
    return {"CapacityReservationId": RESERVATION, "InstanceType": "p4d.24xlarge", "InstancePlatform": "Linux/UNIX",
            "AvailabilityZone": "us-west-2b", "Tenancy": "default", "TotalInstanceCount": 2,
            "AvailableInstanceCount": 2, "State": "active", "ReservationType": "capacity-block",
            "StartDate": datetime.datetime(2026, 12, 7, 11, 30, tzinfo=datetime.UTC),
            "EndDate": datetime.datetime(2026, 12, 14, 11, 30, tzinfo=datetime.UTC), **changes}  # fmt: skip


def _capacity_findings(assembly: Path, answer: dict[str, Any] | str, **needs: Any) -> list[preflight.Finding]:
    ec2 = boto3.client("ec2", region_name="us-west-2", aws_access_key_id="a", aws_secret_access_key="b")
    stub = Stubber(ec2)
    params = {"CapacityReservationIds": [RESERVATION]}
    if isinstance(answer, str):
        stub.add_client_error("describe_capacity_reservations", answer, "not found", expected_params=params)
    else:
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": [answer]}, params)
    stub.activate()
    check = Preflight(_needs(assembly, **{"reservation_id": RESERVATION, "capacity_block": True, **needs}),
                      lambda name: ec2)  # fmt: skip
    check.training_zone = "us-west-2b"
    check.capacity_reservation()
    stub.assert_no_pending_responses()
    return check.findings


def test_an_active_capacity_block_with_room_for_the_run_passes(assembly: Path) -> None:
    (finding,) = _capacity_findings(assembly, _reservation())
    assert finding.line() == (
        f"OK       capacity reservation {RESERVATION}: active, 2 p4d.24xlarge free in us-west-2b, until "
        "2026-12-14 11:30 UTC."
    )


@pytest.mark.parametrize(
    ("answer", "level", "says"),
    [
        ("InvalidCapacityReservationId.NotFound", "BLOCKER", "does not exist in us-west-2 for this account"),
        (_reservation(InstanceType="p5.48xlarge"), "BLOCKER", "it reserves p5.48xlarge, the run launches p4d"),
        (_reservation(AvailabilityZone="us-west-2c"), "BLOCKER", "set training.subnet_index to the subnet of its"),
        (_reservation(ReservationType="default"), "BLOCKER", "not a Capacity Block: set training.market_type to on-"),
        (_reservation(State="expired"), "BLOCKER", "it is expired: reserve capacity again"),
        (_reservation(AvailableInstanceCount=1), "BLOCKER", "has 1 of 2 instances free; a 2-node run needs 2"),
        (_reservation(State="scheduled"), "WARNING", "is scheduled until 2026-12-07 11:30 UTC: a run launched before"),
    ],
    ids=["absent", "other-type", "other-zone", "not-a-block", "expired", "too-small", "not-started"],
)
def test_a_reservation_the_run_cannot_use_is_named_with_what_to_do(
    assembly: Path, answer: Any, level: str, says: str
) -> None:
    (finding,) = _capacity_findings(assembly, answer)
    assert (finding.level, finding.check) == (level, f"capacity reservation {RESERVATION}")
    assert says in finding.message, finding.message


def test_a_reservation_group_is_named_but_not_checked(assembly: Path) -> None:
    group = "arn:aws:resource-groups:us-west-2:111111111111:group/p4d-reservations"
    check = Preflight(_needs(assembly, reservation_group_arn=group), lambda name: None)
    check.capacity_reservation()
    ((level, message),) = [(f.level, f.message) for f in check.findings]
    assert level == "WARNING" and message.startswith(f"{group}: EC2 chooses one of its reservations at launch")


def test_the_templates_carry_the_capacity_target_preflight_reads(assembly: Path) -> None:
    assert (needs_of(assembly, "staging").reservation_id, needs_of(assembly, "prod").capacity_block) == (None, False)
    data = {"CapacityReservationSpecification": {"CapacityReservationTarget": {"CapacityReservationId": RESERVATION}},
            "InstanceMarketOptions": {"MarketType": "capacity-block"}}  # fmt: skip
    assert capacity_target(data) == {
        "reservation_id": RESERVATION, "reservation_group_arn": None, "capacity_block": True
    }  # fmt: skip


def test_an_image_the_endpoint_cannot_run_blocks_its_deploy(aws: None, assembly: Path) -> None:
    """Item 1 of issue 40, in preflight: the serving image built for x86_64 is a blocker naming what to do (absent
    and unpullable images: tests/ops_review/test_image_check.py, the same check)."""
    needs = _needs(assembly)
    uri = _publish_serving_image(needs.region, architecture="amd64")
    account = Account(needs.region)
    account.stacks({}, [needs.foundation_stack])
    account.ec2_quota("L-417A185B", 384.0)
    quotas = {f"{t} for endpoint usage": 20.0 for t in needs.endpoint_maxima}
    account.sagemaker_quotas({**quotas, f"{needs.remote_type} for training job usage": 1.0})
    account.stacks({}, [s.stack_name for s in needs.stacks])
    blockers = [f.line() for f in Preflight(needs, account.client).run() if f.level == "BLOCKER"]
    assert blockers == [
        f"BLOCKER  image {SERVING_PARAMETER}: {uri} is built for x86_64, ml.c7g.xlarge runs arm64: build it on "
        "arm64 (the pipeline's image builds do) and write that digest."
    ]


def _elastic_ip_finding(assembly: Path, in_use: int) -> preflight.Finding:
    """dev's Elastic IP check with ``in_use`` addresses allocated and prod's Foundation deployed, dev's and staging's
    not: its one finding."""
    needs = needs_of(assembly, "dev")
    ec2 = boto3.client("ec2", region_name=needs.region)
    for _ in range(in_use):
        ec2.allocate_address(Domain="vpc")
    account = Account(needs.region)
    account.stacks({}, ["dev-Foundation", "staging-Foundation"])
    account.stacks({"prod-Foundation": {}}, ["prod-Foundation"])
    preflight_run = Preflight(needs, account.client)
    preflight_run.elastic_ips()
    (finding,) = preflight_run.findings
    return finding


def test_elastic_ips_count_only_the_environments_not_deployed_yet(aws: None, assembly: Path) -> None:
    """With prod's Foundation deployed (its three addresses allocated), dev and staging need three more of the
    five: one is free, a blocker that names the two environments and the request to make."""
    finding = _elastic_ip_finding(assembly, in_use=3)
    assert finding.line() == (
        "BLOCKER  Elastic IPs (NAT gateways): 5 allowed, 3 in use; the NAT gateways of the environments sharing this "
        "account and region, not deployed yet, need 3 (dev 1, staging 2): request an increase (aws service-quotas "
        "request-service-quota-increase --service-code ec2 --quota-code L-0263D0A3 --desired-value 6), release "
        "unused addresses, or lower vpc.nat_gateways."
    )


def test_elastic_ips_that_fill_the_quota_exactly_pass(aws: None, assembly: Path) -> None:
    """Two addresses in use and three needed (dev 1, staging 2) fill the quota of five exactly: no blocker."""
    finding = _elastic_ip_finding(assembly, in_use=2)
    assert (finding.level, finding.line().split(": ", 1)[1]) == (
        "OK",
        "5 allowed, 2 in use, 3 more needed (dev 1, staging 2).",
    )


def test_an_interface_endpoint_service_missing_from_a_zone_blocks_the_foundation(aws: None, assembly: Path) -> None:
    """prod's three private subnets sit in the region's first three zones (Fn::GetAZs); a service offered in two of
    them fails the Foundation's create: one line per such service."""
    needs = needs_of(assembly, "prod")
    account = Account(needs.region, endpoint_zones=["us-west-2a", "us-west-2b"])
    preflight_run = Preflight(needs, account.client)
    preflight_run.endpoint_services()
    assert len(needs.endpoint_services) == len(preflight_run.findings) >= 9
    assert preflight_run.findings[0].line() == (
        f"BLOCKER  interface endpoint {needs.endpoint_services[0]}: not offered in us-west-2c (the region's zones, as "
        "Fn::GetAZs lists them): the Foundation's create fails; deploy to a region whose first zones offer it, or "
        "lower vpc.max_azs."
    )
    offered = Preflight(needs, Account(needs.region).client)
    offered.endpoint_services()
    assert {f.level for f in offered.findings} == {"OK"}


def test_a_new_pipeline_account_whose_codebuild_runs_no_build_is_a_blocker(tmp_path: Path) -> None:
    """The pipeline's projects (a hand-made template of two project types, as the pipeline's synth and image builds
    use) against Service Quotas answered as a new account may: Linux/Medium at 0. The quota names are as preflight
    expects them ("Concurrently running builds for <OS>/<size> environment"), not read from AWS here."""
    project = {"Type": "AWS::CodeBuild::Project", "Properties": {"Environment": {}}}

    def of(kind: str, size: str) -> dict[str, Any]:
        return {**project, "Properties": {"Environment": {"Type": kind, "ComputeType": f"BUILD_GENERAL1_{size}"}}}

    template = {"Resources": {"Synth": of("LINUX_CONTAINER", "MEDIUM"), "Assets": of("LINUX_CONTAINER", "MEDIUM"),
                              "Serving": of("ARM_CONTAINER", "LARGE")}}  # fmt: skip
    (tmp_path / "PromotionPipeline.template.json").write_text(json.dumps(template))
    manifest = {"version": "48.0.0", "artifacts": {"PromotionPipeline": {"type": "aws:cloudformation:stack",
                "environment": "aws://999999999999/us-west-2",
                "properties": {"templateFile": "PromotionPipeline.template.json"}}}}  # fmt: skip
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    quotas = boto3.session.Session(region_name="us-west-2").client("service-quotas")
    stub = Stubber(quotas)
    stub.add_response("list_service_quotas", {"Quotas": []}, {"ServiceCode": "codebuild"})
    name = "Concurrently running builds for {} environment"
    defaults = [_quota("codebuild", "L-00000001", name.format("Linux/Medium"), 0.0),
                _quota("codebuild", "L-00000002", name.format("ARM/Large"), 1.0),
                _quota("codebuild", "L-00000003", name.format("Linux/2XLarge"), 1.0)]  # fmt: skip
    stub.add_response("list_aws_default_service_quotas", {"Quotas": defaults}, {"ServiceCode": "codebuild"})
    stub.activate()
    lines = [f.line() for f in preflight.codebuild_quotas(tmp_path, lambda name: quotas)]
    assert lines == [
        "OK       CodeBuild quota for arm/large builds: 1 at once; the pipeline has 1 projects of it.",
        "BLOCKER  CodeBuild quota for linux/medium builds: 0: no linux/medium build can run, so the pipeline cannot "
        "start; request an increase (aws service-quotas request-service-quota-increase --service-code codebuild "
        "--quota-code L-00000001 --desired-value 2).",
    ]


def test_the_remote_type_is_checked_in_the_zones_of_the_jobs_subnets(aws: None, assembly: Path) -> None:
    """The @remote jobs run in the private subnets (config.yaml's VpcConfig lists them all): moto offers p4d.24xlarge in
    eu-west-1 only in eu-west-1c, so staging's two subnets (a, b) cannot run the job, prod's three can, in one of
    them; in us-west-2 every subnet's zone offers it."""
    findings = {}
    for environment, region in (("staging", "eu-west-1"), ("prod", "eu-west-1"), ("staging", "us-west-2")):
        run = Preflight(_needs(assembly, environment, region=region), Account(region).client)
        run.remote_instance_zones()
        (findings[environment, region],) = [f.line() for f in run.findings]
    assert findings["staging", "eu-west-1"] == (
        "BLOCKER  ml.p4d.24xlarge in the @remote job subnets' zones: none of eu-west-1a, eu-west-1b (the region's "
        "zones, as Fn::GetAZs lists them) offers p4d.24xlarge: set training.remote_instance_type to a type the zones "
        "offer, or another region."
    )
    assert findings["prod", "eu-west-1"] == (
        "WARNING  ml.p4d.24xlarge in the @remote job subnets' zones: only eu-west-1c of eu-west-1a, eu-west-1b, "
        "eu-west-1c offer p4d.24xlarge: SageMaker places every instance there."
    )
    assert findings["staging", "us-west-2"].startswith("OK       ml.p4d.24xlarge in the @remote job subnets' zones")
