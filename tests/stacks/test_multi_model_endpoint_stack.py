"""Template tests of MultiModelEndpointStack: one synthesis (with the cdk-nag gates) for the whole module."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam
from aws_cdk import cx_api
from aws_cdk.assertions import Annotations, Match, Template

from mme_sizing.plan import METADATA_KEY, SizingInputs, hot_set_resident
from platform_facts.instances import has_local_nvme, instance_type
from stacks.compliance import acknowledge, add_compliance_gates
from stacks.foundation import FoundationStack
from stacks.multi_model_endpoint import CPU_UTILIZATION_SHARE, MultiModelEndpointStack
from stacks.settings import parse_environment
from tests.conftest import cdk_context

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = cdk_context()
ENVIRONMENTS = CONTEXT["environments"]
# What cdk.json asks of each environment's multi-model endpoint: the templates must carry it.
MME = {name: parse_environment(name, ENVIRONMENTS[name]).multi_model_endpoint for name in ("dev", "prod")}
ALLOWED = ["tenant-a.tar.gz", "team/tenant-b.tar.gz"]


def _staging_variant() -> dict:
    """Staging with the alternatives switched on: an alarm e-mail, an invoke grant for two models."""
    raw = json.loads(json.dumps(ENVIRONMENTS["staging"]))
    raw["alarm_email"] = "ml-oncall@example.com"
    raw["multi_model_endpoint"].update(invoke_allowed_models=ALLOWED)
    return raw


@pytest.fixture(scope="module")
def synthesized():
    app = cdk.App(context={k: v for k, v in CONTEXT.items() if k != "environments"})
    stacks = {}
    for name, raw in (("dev", ENVIRONMENTS["dev"]), ("prod", ENVIRONMENTS["prod"]), ("staging", _staging_variant())):
        settings = parse_environment(name, raw)
        stage = cdk.Stage(app, name, env=cdk.Environment(account=settings.account, region=settings.region))
        foundation = FoundationStack(stage, "Foundation", settings=settings)
        stacks[name] = MultiModelEndpointStack(stage, "MultiModelEndpoint", settings=settings, foundation=foundation)
    # A client stack: grant_invoke to a role, once for all models, once for a list.
    client = cdk.Stack(stacks["dev"].node.scope, "Client")
    reason = "Test client roles: grant_invoke adds to their default (inline) policy."
    acknowledge(client, reason, "NIST.800.53.R5-IAMNoInlinePolicy")
    stacks["dev"].grant_invoke(iam.Role(client, "AllModels", assumed_by=iam.AccountRootPrincipal()))
    stacks["dev"].grant_invoke(
        iam.Role(client, "OneTenant", assumed_by=iam.AccountRootPrincipal()), models=["tenant-a.tar.gz"]
    )
    add_compliance_gates(app)
    assembly = app.synth()  # raises ValidationFailed on any unacknowledged cdk-nag finding
    templates = {name: Template.from_stack(stack) for name, stack in stacks.items()}
    templates["client"] = Template.from_stack(client)
    warnings = {name: _warnings(assembly, stack) for name, stack in stacks.items()}
    return stacks, templates, warnings


def _warnings(assembly: cx_api.CloudAssembly, stack: cdk.Stack) -> list[str]:
    """The stack's warnings from the one synthesis (``Annotations.from_stack`` would synthesize the app again)."""
    messages = assembly.get_stack_artifact(stack.artifact_id).messages
    return [str(m.entry.data) for m in messages if m.level == cx_api.SynthesisMessageLevel.WARNING]


@pytest.fixture(scope="module")
def templates(synthesized):
    return synthesized[1]


def _one(template: Template, resource_type: str) -> dict:
    resources = template.find_resources(resource_type)
    assert len(resources) == 1, resources
    return next(iter(resources.values()))


def _logical_id(template: Template, resource_type: str) -> str:
    resources = template.find_resources(resource_type)
    assert len(resources) == 1
    return next(iter(resources))


def test_model_is_multi_model_over_a_prefix(templates):
    model = _one(templates["dev"], "AWS::SageMaker::Model")["Properties"]
    container = model["PrimaryContainer"]
    assert container["Mode"] == "MultiModel"
    parts = container["ModelDataUrl"]["Fn::Join"][1]
    assert parts[0] == "s3://" and parts[-1] == "/multi-model/"  # a prefix: ends in '/'
    assert "ModelName" not in model  # generated: CloudFormation replaces models on change
    assert model["EnableNetworkIsolation"] is True
    assert set(model["VpcConfig"]) == {"SecurityGroupIds", "Subnets"}


def test_image_is_djl_in_every_environment(templates):
    """DJL Serving is the only multi-model server: the TorchServe DLC ended patching (platform_facts/images.json)."""
    for name in ("dev", "staging", "prod"):
        image = json.dumps(_one(templates[name], "AWS::SageMaker::Model")["Properties"]["PrimaryContainer"]["Image"])
        djl_image = parse_environment(name, ENVIRONMENTS[name]).multi_model_endpoint.djl_image
        assert djl_image.startswith("djl-inference:")
        assert "763104351884.dkr.ecr.us-west-2." in image and f"/{djl_image}" in image
    dev_environment = _one(templates["dev"], "AWS::SageMaker::Model")["Properties"]["PrimaryContainer"]["Environment"]
    assert dev_environment == {"OMP_NUM_THREADS": "1"}  # DJL: maxWorkers = #CPU / OMP_NUM_THREADS


def test_model_waits_for_the_execution_role(synthesized):
    stacks = synthesized[0]
    assert stacks["dev"].foundation in stacks["dev"].dependencies


def test_endpoint_config_key_only_where_the_type_allows_it(templates):
    # cdk.json gives dev an EBS-only type (it takes the platform key) and prod one with local NVMe (it refuses one).
    assert (has_local_nvme(MME["dev"].instance_type), has_local_nvme(MME["prod"].instance_type)) == (False, True)
    dev = _one(templates["dev"], "AWS::SageMaker::EndpointConfig")["Properties"]
    assert "KmsKeyId" in dev
    assert "EndpointConfigName" not in dev
    prod = _one(templates["prod"], "AWS::SageMaker::EndpointConfig")
    assert "KmsKeyId" not in prod["Properties"]
    variant = prod["Properties"]["ProductionVariants"][0]
    assert (variant["InstanceType"], variant["InitialInstanceCount"]) == (
        MME["prod"].instance_type,
        MME["prod"].initial_instance_count,
    )


def test_endpoint_keeps_the_scaled_instance_count_on_updates(templates):
    endpoint = _one(templates["dev"], "AWS::SageMaker::Endpoint")["Properties"]
    assert endpoint["EndpointName"] == "dev-MultiModelEndpoint"  # fixed, for its log group; updates stay in place
    (group,) = [
        g["Properties"]
        for g in templates["dev"].find_resources("AWS::Logs::LogGroup").values()
        if "LogGroupName" in g["Properties"]
    ]
    assert group["LogGroupName"] == "/aws/sagemaker/Endpoints/dev-MultiModelEndpoint"
    assert group["RetentionInDays"] == parse_environment("dev", ENVIRONMENTS["dev"]).logs.retention_days
    assert "KmsKeyId" in group
    assert endpoint["RetainAllVariantProperties"] is True
    excluded = {p["VariantPropertyType"] for p in endpoint["ExcludeRetainedVariantProperties"]}
    assert excluded == {"DesiredWeight", "DataCaptureConfig"}  # DesiredInstanceCount is kept


def test_scalable_target_follows_the_endpoint_and_tracks_invocations(templates):
    template = templates["prod"]
    endpoint_id = _logical_id(template, "AWS::SageMaker::Endpoint")
    target = _one(template, "AWS::ApplicationAutoScaling::ScalableTarget")["Properties"]
    assert target["ResourceId"] == {
        "Fn::Join": ["", ["endpoint/", {"Fn::GetAtt": [endpoint_id, "EndpointName"]}, "/variant/AllTraffic"]]
    }  # the GetAtt orders the target after the endpoint
    scaling = MME["prod"].autoscaling
    assert (target["MinCapacity"], target["MaxCapacity"]) == (scaling.min_capacity, scaling.max_capacity)
    assert target["ScalableDimension"] == "sagemaker:variant:DesiredInstanceCount"
    assert "RoleARN" not in target  # the service-linked role, not a role without permissions
    roles = template.find_resources("AWS::IAM::Role").values()
    principals = [s["Principal"] for r in roles for s in r["Properties"]["AssumeRolePolicyDocument"]["Statement"]]
    assert principals == [{"Service": "lambda.amazonaws.com"}]  # only the ENI wait's role; no autoscaling role
    policy = _one(template, "AWS::ApplicationAutoScaling::ScalingPolicy")["Properties"]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["PredefinedMetricSpecification"] == {
        "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
    }
    assert (tracking["TargetValue"], tracking["ScaleInCooldown"], tracking["ScaleOutCooldown"]) == (
        scaling.target_invocations_per_instance,
        scaling.scale_in_cooldown_seconds,
        scaling.scale_out_cooldown_seconds,
    )


def test_alarms_watch_loading_cache_errors_cpu_and_memory(templates):
    template = templates["dev"]
    alarms = template.find_resources("AWS::CloudWatch::Alarm")
    by_metric = {a["Properties"]["MetricName"]: a["Properties"] for a in alarms.values()}
    assert set(by_metric) == {
        "ModelLoadingWaitTime",
        "ModelCacheHit",
        "Invocation5XXErrors",
        "CPUUtilization",
        "MemoryUtilization",
    }
    assert by_metric["ModelCacheHit"]["ComparisonOperator"] == "LessThanThreshold"
    assert by_metric["CPUUtilization"]["Namespace"] == "/aws/sagemaker/Endpoints"
    vcpus = instance_type(MME["dev"].instance_type).vcpus
    assert by_metric["CPUUtilization"]["Threshold"] == CPU_UTILIZATION_SHARE * 100 * vcpus
    assert by_metric["ModelLoadingWaitTime"]["Namespace"] == "AWS/SageMaker"
    topic_id = _logical_id(template, "AWS::SNS::Topic")
    for alarm in by_metric.values():
        assert alarm["AlarmActions"] == [{"Ref": topic_id}]
        assert {d["Name"] for d in alarm["Dimensions"]} == {"EndpointName", "VariantName"}
    assert "KmsMasterKeyId" in _one(template, "AWS::SNS::Topic")["Properties"]
    template.resource_count_is("AWS::SNS::Subscription", 0)  # dev has no alarm_email
    templates["staging"].has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ml-oncall@example.com"}
    )


def _statements(template: Template, resource_type: str, name_hint: str) -> list[dict]:
    found = template.find_resources(resource_type)
    return [
        statement
        for logical_id, resource in found.items()
        if name_hint in logical_id
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_invoke_policy_limits_target_models_when_listed(templates):
    (everything,) = _statements(templates["dev"], "AWS::IAM::ManagedPolicy", "InvokePolicy")
    assert everything["Action"] == "sagemaker:InvokeEndpoint" and "Condition" not in everything
    (limited,) = _statements(templates["staging"], "AWS::IAM::ManagedPolicy", "InvokePolicy")
    assert limited["Condition"] == {"StringEquals": {"sagemaker:TargetModel": ALLOWED}}
    endpoint_id = _logical_id(templates["staging"], "AWS::SageMaker::Endpoint")
    assert limited["Resource"] == {"Fn::GetAtt": [endpoint_id, "EndpointArn"]}


def test_grant_invoke_adds_the_target_model_condition(templates):
    client = templates["client"]
    all_models = _statements(client, "AWS::IAM::Policy", "AllModels")
    one_tenant = _statements(client, "AWS::IAM::Policy", "OneTenant")
    assert [s["Action"] for s in all_models] == ["sagemaker:InvokeEndpoint"]
    assert "Condition" not in all_models[0]
    assert one_tenant[0]["Condition"] == {"StringEquals": {"sagemaker:TargetModel": ["tenant-a.tar.gz"]}}
    assert "Fn::ImportValue" in json.dumps(one_tenant[0]["Resource"])  # the endpoint ARN, not a re-typed string


def test_grant_invoke_refuses_bad_model_lists(synthesized):
    stacks = synthesized[0]
    with pytest.raises(ValueError, match="at least one"):
        stacks["dev"].invoke_statement([])
    with pytest.raises(ValueError, match="model name"):
        stacks["dev"].invoke_statement(["not a model"])


# --- sizing: what the endpoint is sized for travels in the template; synth warns when the hot set cannot stay loaded

HOT_SET_WARNING = re.compile(r"hot (set|model)")


def test_endpoint_records_its_sizing_inputs_for_the_review(synthesized, templates):
    stacks = synthesized[0]
    endpoint = _one(templates["prod"], "AWS::SageMaker::Endpoint")
    recorded = SizingInputs.from_metadata(endpoint["Metadata"][METADATA_KEY])
    assert recorded == SizingInputs.from_settings(stacks["prod"].settings.multi_model_endpoint)
    sizing = MME["prod"].sizing
    assert (recorded.instance_type, recorded.models, recorded.requests_per_second) == (
        MME["prod"].instance_type,
        sizing.models,
        sizing.requests_per_second,
    )


def test_cdk_json_environments_keep_the_hot_set_resident(synthesized):
    stacks, _, warnings = synthesized
    for name in ("dev", "prod"):
        assert hot_set_resident(stacks[name].settings.multi_model_endpoint) is None
        assert not [warning for warning in warnings[name] if HOT_SET_WARNING.search(warning)]


def test_synth_warns_when_min_capacity_cannot_hold_the_hot_set():
    raw = json.loads(json.dumps(ENVIRONMENTS["prod"]))
    raw["multi_model_endpoint"].update(
        instance_type="ml.c5.large",
        initial_instance_count=1,
        autoscaling={"min_capacity": 1, "max_capacity": 2},
        sizing={"models": 1000, "requests_per_second": 2000},
    )
    settings = parse_environment("prod", raw)
    app = cdk.App(context={k: v for k, v in CONTEXT.items() if k != "environments"})
    stage = cdk.Stage(app, "prod", env=cdk.Environment(account=settings.account, region=settings.region))
    foundation = FoundationStack(stage, "Foundation", settings=settings)
    stack = MultiModelEndpointStack(stage, "MultiModelEndpoint", settings=settings, foundation=foundation)
    Annotations.from_stack(stack).has_warning(
        "/prod/MultiModelEndpoint",
        Match.string_like_regexp(
            r"min_capacity 1 x ml\.c5\.large .* raise multi_model_endpoint\.autoscaling\.min_capacity"
        ),
    )
