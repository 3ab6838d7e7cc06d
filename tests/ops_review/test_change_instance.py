"""`pytorch-platform change-endpoint-instance` against moto: an autoscaled endpoint moves to another instance type,
its scaling is restored exactly, and every call the operator makes is allowed by the policy the command says it needs
(`--print-policy`), checked by the project's IAM evaluator.

moto 5.2.5 models SageMaker endpoints and Application Auto Scaling but has no UpdateEndpoint: the test adds it with
the one rule this command exists for, from SageMaker's developer guide ("Update endpoints that use auto scaling",
https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-scaling-update.html): "If the update would change the
instance type for any model that is a target for auto scaling, the update fails." The error wording is the test's.
The deploy is played as CloudFormation updates the stack: a new endpoint config, then UpdateEndpoint with
RetainAllVariantProperties (the stack's setting).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.applicationautoscaling.models import applicationautoscaling_backends
from moto.sagemaker.exceptions import ValidationError
from moto.sagemaker.models import FakeEndpointConfig
from moto.sagemaker.responses import SageMakerResponse

from ops_review import change_instance
from ops_review.change_instance import DIMENSION, ChangeRefused, Planned, change_instance_type, required_policy
from ops_review.review import StackTemplate
from proving_ground.rehearsal.aws_calls import Gate, Principal, install
from stacks.settings import parse_environment
from tests.conftest import cdk_context as load_cdk_context

REGION, ACCOUNT = "us-west-2", "123456789012"
OLD, NEW = "ml.c7g.2xlarge", "ml.c7g.xlarge"
OPERATOR, DEPLOYER = "operator", "cloudformation"


def _update_endpoint(self: SageMakerResponse) -> str:
    params = json.loads(self.body)
    backend = self.sagemaker_backend
    endpoint = backend.endpoints[params["EndpointName"]]
    old = {v["VariantName"]: v for v in backend.endpoint_configs[endpoint.endpoint_config_name].production_variants}
    new = backend.endpoint_configs[params["EndpointConfigName"]]
    targets = applicationautoscaling_backends[self.current_account][self.region].targets.get(DIMENSION, {})
    for variant in new.production_variants:
        resource_id = f"endpoint/{endpoint.endpoint_name}/variant/{variant['VariantName']}"
        before = old.get(variant["VariantName"])
        if before and before["InstanceType"] != variant["InstanceType"] and resource_id in targets:
            raise ValidationError(
                message=f"The variant {variant['VariantName']} of endpoint {endpoint.endpoint_name} is registered as a "
                "scalable target: deregister it before changing its instance type."
            )
    endpoint.endpoint_config_name = new.endpoint_config_name
    return json.dumps({"EndpointArn": endpoint.arn})


@functools.cache
def _session(access_key: str, secret_key: str) -> boto3.session.Session:
    """One session per principal for the module: a new one parsed the services' models (megabytes of JSON) again."""
    return boto3.session.Session(access_key, secret_key, region_name=REGION)


@pytest.fixture
def planned(templates: dict[str, dict[str, dict]]) -> Planned:
    """The staging Graviton endpoint as synthesized (ml.c7g.xlarge, 8 to 16 instances, one target-tracking policy)."""
    stack = StackTemplate("staging", "GravitonEndpoint", "staging-GravitonEndpoint", REGION, None,
                          templates["staging"]["GravitonEndpoint"], {})  # fmt: skip
    return change_instance.planned_from_template(stack)


@pytest.fixture
def aws(planned: Planned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """moto with the endpoint running the old type, scaled as the stack scales it; the operator's calls checked."""
    for name in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(SageMakerResponse, "update_endpoint", _update_endpoint, raising=False)
    monkeypatch.setattr(FakeEndpointConfig, "validate_instance_type", lambda self, t: None)  # moto's list is old
    principals = [
        Principal(OPERATOR, "AKIAOPERATOR0000", [required_policy(planned.endpoint_name, REGION, ACCOUNT)],
                  {"aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/ml-operator", "aws:userid": "AROAOP:alice"}),
        Principal(DEPLOYER, "AKIADEPLOYER0000", None),  # CloudFormation's role: not this command's
    ]  # fmt: skip
    gate = Gate(ACCOUNT, REGION, tmp_path / "calls.jsonl", principals)
    with mock_aws():
        uninstall = install(gate)

        def client(principal: str) -> Any:
            key = gate.principal(principal)
            return _session(key.access_key, key.secret_key).client

        sagemaker, autoscaling = client(DEPLOYER)("sagemaker"), client(DEPLOYER)("application-autoscaling")
        iam = client(DEPLOYER)("iam")
        role = iam.create_role(RoleName="endpoint-role", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        sagemaker.create_model(ModelName="model-v1", ExecutionRoleArn=role, PrimaryContainer={"Image": "image"})
        _config(sagemaker, "config-v1", OLD)
        sagemaker.create_endpoint(EndpointName=planned.endpoint_name, EndpointConfigName="config-v1")
        change_instance.register(autoscaling, planned.scaling)  # as the stack registered it
        try:
            yield {
                "gate": gate,
                "operator": client(OPERATOR),
                "deployer": client(DEPLOYER),
                "state": tmp_path / "s.json",
            }
        finally:
            uninstall()


def _config(sagemaker: Any, name: str, instance_type: str) -> None:
    variant = {"VariantName": "AllTraffic", "ModelName": "model-v1", "InitialInstanceCount": 2,
               "InstanceType": instance_type, "InitialVariantWeight": 1.0}  # fmt: skip
    sagemaker.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[variant])


def _cloudformation_update(aws: dict[str, Any], calls: list[str]) -> Any:
    """What `cdk deploy` of the changed stack does: a new endpoint config, then UpdateEndpoint."""

    def deploy(planned: Planned) -> int:
        sagemaker = aws["deployer"]("sagemaker")
        (instance_type,) = planned.instance_types.values()
        _config(sagemaker, "config-v2", instance_type)
        sagemaker.update_endpoint(EndpointName=planned.endpoint_name, EndpointConfigName="config-v2",
                                  RetainAllVariantProperties=True)  # fmt: skip
        calls.append("deployed")
        return 0

    return deploy


def _scaling(aws: dict[str, Any], planned: Planned) -> dict[str, Any]:
    return change_instance.registered_scaling(aws["deployer"]("application-autoscaling"), list(planned.scaling))


def test_the_type_changes_and_the_scaling_comes_back_as_it_was(aws: dict[str, Any], planned: Planned) -> None:
    before = _scaling(aws, planned)
    assert before and all(target["policies"] for target in before.values())
    deployed: list[str] = []
    already = len(aws["gate"].records())  # the stack's own registration above

    code = change_instance_type(planned, aws["operator"], _cloudformation_update(aws, deployed),
                                state_file=aws["state"], poll_s=0, log=lambda line: None)  # fmt: skip

    assert code == 0 and deployed == ["deployed"]
    status, types = change_instance.running_instance_types(aws["deployer"]("sagemaker"), planned.endpoint_name)
    assert (status, types) == ("InService", {"AllTraffic": NEW})
    assert _scaling(aws, planned) == before  # same capacities, same policies
    assert json.loads(aws["state"].read_text()) == json.loads(json.dumps(before))
    records = aws["gate"].records()[already:]
    operator = [r for r in records if r.principal == OPERATOR]
    assert operator and all(r.allowed for r in operator), [r for r in operator if not r.allowed]
    order = [r.operation for r in records if r.operation in
             ("DeleteScalingPolicy", "DeregisterScalableTarget", "UpdateEndpoint", "RegisterScalableTarget",
              "PutScalingPolicy")]  # fmt: skip
    assert order == ["DeleteScalingPolicy", "DeregisterScalableTarget", "UpdateEndpoint", "RegisterScalableTarget",
                     "PutScalingPolicy"]  # fmt: skip


def test_a_plain_deploy_fails_while_the_variant_is_a_scalable_target(aws: dict[str, Any], planned: Planned) -> None:
    with pytest.raises(ClientError, match="deregister it before changing its instance type"):
        _cloudformation_update(aws, [])(planned)


def test_a_failed_deploy_restores_the_scaling_and_says_so(aws: dict[str, Any], planned: Planned) -> None:
    before = _scaling(aws, planned)
    with pytest.raises(ChangeRefused, match="exited 1; the endpoint keeps its old type"):
        change_instance_type(planned, aws["operator"], lambda planned: 1, state_file=aws["state"], poll_s=0,
                             log=lambda line: None)  # fmt: skip
    assert _scaling(aws, planned) == before


def test_a_scaling_change_in_the_same_deploy_is_refused_before_anything_changes(
    aws: dict[str, Any], planned: Planned
) -> None:
    before = _scaling(aws, planned)
    (resource_id,) = planned.scaling
    changed = {resource_id: {**planned.scaling[resource_id], "MaxCapacity": 9}}
    other = Planned(planned.stack_name, planned.stack_path, planned.endpoint_name, planned.instance_types, changed)
    deploys: list[Planned] = []
    # A short wait: were the refusal missed, the deploy below changes nothing and the wait would end the test.
    with pytest.raises(ChangeRefused, match="in a deploy of its own"):
        change_instance_type(other, aws["operator"], lambda planned: deploys.append(planned) or 0,
                             state_file=aws["state"], timeout_s=1, poll_s=0, log=lambda line: None)  # fmt: skip
    assert deploys == []
    assert _scaling(aws, planned) == before
    assert not aws["state"].exists()


def test_nothing_happens_when_the_type_does_not_change(aws: dict[str, Any], planned: Planned) -> None:
    same = Planned(planned.stack_name, planned.stack_path, planned.endpoint_name, {"AllTraffic": OLD}, planned.scaling)
    lines: list[str] = []
    assert change_instance_type(same, aws["operator"], lambda planned: 1, state_file=aws["state"],
                                log=lines.append) == 0  # fmt: skip
    assert "nothing to change" in lines[0]
    assert [r.operation for r in aws["gate"].records() if r.principal == OPERATOR] == [
        "DescribeEndpoint", "DescribeEndpointConfig"]  # fmt: skip


def test_the_synthesized_endpoint_is_read_from_the_cloud_assembly(cloud_assembly: Any) -> None:
    planned = change_instance.planned_endpoint(Path(cloud_assembly.directory), "staging", "graviton")
    settings = parse_environment("staging", load_cdk_context()["environments"]["staging"]).graviton_endpoint
    assert (planned.endpoint_name, planned.stack_path) == ("staging-GravitonEndpoint", "staging/GravitonEndpoint")
    assert planned.instance_types == {"AllTraffic": settings.instance_type}
    ((resource_id, scaling),) = planned.scaling.items()
    assert resource_id == "endpoint/staging-GravitonEndpoint/variant/AllTraffic"
    autoscaling = settings.autoscaling
    assert (scaling["MinCapacity"], scaling["MaxCapacity"]) == (autoscaling.min_capacity, autoscaling.max_capacity)
    (policy,) = scaling["policies"].values()
    assert (
        policy["TargetTrackingScalingPolicyConfiguration"]["TargetValue"] == autoscaling.target_invocations_per_instance
    )
    with pytest.raises(ChangeRefused, match="no dev/GravitonEndpoint stack"):
        change_instance.planned_endpoint(Path(cloud_assembly.directory), "dev", "graviton")


def test_the_endpoint_counts_as_changed_only_once_it_runs_the_new_type() -> None:
    """Right after the deploy the endpoint may still be InService on the old type (SageMaker has not started the
    update yet): the command waits through that and the update, and returns once it is InService on the new type;
    an endpoint that fails is refused at once."""
    planned = Planned("s", "dev/s", "e", {"AllTraffic": "ml.c7g.2xlarge"}, {})

    class Endpoint:
        def __init__(self, states: list[tuple[str, str]]) -> None:
            self.states, self.polls = states, 0

        def describe_endpoint(self, EndpointName: str) -> dict[str, Any]:
            self.polls += 1
            return {"EndpointStatus": self.states[min(self.polls, len(self.states)) - 1][0], "EndpointConfigName": "c"}

        def describe_endpoint_config(self, EndpointConfigName: str) -> dict[str, Any]:
            instance_type = self.states[min(self.polls, len(self.states)) - 1][1]
            return {"ProductionVariants": [{"VariantName": "AllTraffic", "InstanceType": instance_type}]}

    sleeps: list[float] = []
    old, new = "ml.c7g.xlarge", "ml.c7g.2xlarge"
    updating = Endpoint([("InService", old), ("Updating", old), ("InService", new)])
    change_instance.wait_in_service(updating, planned, timeout_s=3600, poll_s=30, sleep=sleeps.append)
    assert (updating.polls, sleeps) == (3, [30, 30])
    with pytest.raises(ChangeRefused, match="endpoint e is Failed with"):
        change_instance.wait_in_service(Endpoint([("Failed", old)]), planned, timeout_s=3600, poll_s=30, sleep=print)
