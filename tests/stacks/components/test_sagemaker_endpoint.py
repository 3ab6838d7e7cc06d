"""SageMakerEndpoint and DlcImage on a bare cdk.Stack: what each builds, independent of the platform's stacks."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Match, Template

from ops_review.iam_policy import Request, is_allowed, resolve
from proving_ground.iam_requests import logical_id, role_policies
from stacks.components.sagemaker_endpoint import (
    AlarmSpec,
    DlcImage,
    Rollout,
    SageMakerEndpoint,
    endpoint_name_for,
)
from stacks.settings import DEFAULT_REGION
from tests.conftest import cdk_context
from tests.stacks.components.bare_endpoint import (
    ACCOUNT,
    AUTOSCALING,
    REGION,
    endpoint_on_bare_stack,
    server_errors_alarm,
)
from tests.stacks.components.bare_stack import refs

OTHER_ACCOUNT = "999999999999"


@pytest.fixture(scope="module")
def single() -> tuple[cdk.Stack, SageMakerEndpoint, Template]:
    stack, endpoint = endpoint_on_bare_stack(environment={"OMP_NUM_THREADS": "4"}, alarm_email="oncall@example.com")
    endpoint.add_alarms(
        [
            server_errors_alarm(endpoint, threshold=5),
            AlarmSpec(
                "Latency",
                "slow",
                endpoint.metric_model_latency(statistic="p99", period=cdk.Duration.minutes(1)),
                1e6,
                cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                periods=5,
                datapoints=3,
            ),
        ]
    )
    endpoint.grant_invoke(iam.Role(stack, "Client", assumed_by=iam.AccountRootPrincipal()))
    return stack, endpoint, Template.from_stack(stack)


def _id(template: Template, resource_type: str) -> str:
    (logical_id,) = template.find_resources(resource_type)
    return logical_id


def test_model_runs_the_image_in_the_vpc_after_its_role_and_its_image_pull(single) -> None:
    stack, endpoint, template = single
    template.has_resource(
        "AWS::SageMaker::Model",
        {
            "Properties": {
                "ExecutionRoleArn": {"Fn::GetAtt": [Match.string_like_regexp("^Role"), "Arn"]},
                "PrimaryContainer": {
                    "Image": "763104351884.dkr.ecr.us-west-2.amazonaws.com/"
                    "pytorch-inference-arm64:2.6.0-cpu-py312-ubuntu22.04-sagemaker",
                    "ModelDataUrl": "s3://bucket/endpoints/model.tar.gz",
                    "Mode": "SingleModel",
                    "Environment": {"OMP_NUM_THREADS": "4"},
                },
                "EnableNetworkIsolation": True,
                "VpcConfig": {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": ["subnet-0123456789abcdef0"]},
            },
            "DependsOn": Match.array_with([stack.get_logical_id(endpoint.image.pull_policy.node.default_child)]),
        },
    )
    model = next(iter(template.find_resources("AWS::SageMaker::Model").values()))
    assert any(d.startswith("Role") for d in model["DependsOn"]), "SageMaker checks the role on CreateModel"


def _values(stack: cdk.Stack, endpoint: SageMakerEndpoint, template: dict) -> dict:
    """refs() of the template in the bare stack's account, with the endpoint's ARN."""
    values = {**refs(template), "AWS::AccountId": ACCOUNT}
    endpoint_id = stack.get_logical_id(endpoint.endpoint)
    values[f"{endpoint_id}.EndpointArn"] = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/{endpoint_id.lower()}"
    return values


PULL = {"ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"}
ECR_ACTIONS = [*sorted(PULL), "ecr:PutImage", "ecr:InitiateLayerUpload", "ecr:BatchDeleteImage",
               "ecr:SetRepositoryPolicy"]  # fmt: skip


def test_the_image_grants_the_pull_of_exactly_its_own_repository(single) -> None:
    """The endpoint role's policies, evaluated: the pull actions on the image's repository, nothing else of ECR there,
    and nothing on another repository of the same registry."""
    stack, endpoint, assertions = single
    template = assertions.to_json()
    policies = role_policies(
        template, logical_id(template, "AWS::IAM::Role", "Role"), _values(stack, endpoint, template)
    )
    registry = f"arn:aws:ecr:{REGION}:763104351884:repository"
    own, other = f"{registry}/pytorch-inference-arm64", f"{registry}/pytorch-training"
    assert {action for action in ECR_ACTIONS if is_allowed(policies, Request(action, own))} == PULL
    assert not [action for action in ECR_ACTIONS if is_allowed(policies, Request(action, other))]


def test_config_is_encrypted_and_the_endpoint_keeps_scaled_counts(single) -> None:
    _, _, template = single
    config = _id(template, "AWS::SageMaker::EndpointConfig")
    template.has_resource_properties(
        "AWS::SageMaker::EndpointConfig",
        {
            "KmsKeyId": {"Fn::GetAtt": [_id(template, "AWS::KMS::Key"), "Arn"]},
            "ProductionVariants": [
                Match.object_like(
                    {
                        "VariantName": "AllTraffic",
                        "InstanceType": "ml.c7g.xlarge",
                        "InitialInstanceCount": 1,
                        "ModelName": {"Fn::GetAtt": [_id(template, "AWS::SageMaker::Model"), "ModelName"]},
                    }
                )
            ],
            "EndpointConfigName": Match.absent(),
        },
    )
    template.has_resource_properties(
        "AWS::SageMaker::Endpoint",
        {
            "EndpointConfigName": {"Fn::GetAtt": [config, "EndpointConfigName"]},
            "RetainAllVariantProperties": True,
            "ExcludeRetainedVariantProperties": [{"VariantPropertyType": "DataCaptureConfig"}],
        },
    )


@pytest.mark.parametrize(
    "instance_type", ["ml.c6gd.2xlarge", "ml.c5d.xlarge", "ml.g5.xlarge", "ml.m5d.xlarge", "ml.r5d.xlarge"]
)
def test_types_with_local_nvme_get_no_config_key(instance_type: str) -> None:
    stack, _ = endpoint_on_bare_stack(instance_type)
    Template.from_stack(stack).has_resource_properties("AWS::SageMaker::EndpointConfig", {"KmsKeyId": Match.absent()})


# p3 is "EBS only" in AWS's instance-store table (https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html).
@pytest.mark.parametrize("instance_type", ["ml.p3.2xlarge", "ml.c5.xlarge"])
def test_ebs_only_types_get_the_platform_key(instance_type: str) -> None:
    stack, _ = endpoint_on_bare_stack(instance_type)
    template = Template.from_stack(stack)
    template.has_resource_properties(
        "AWS::SageMaker::EndpointConfig", {"KmsKeyId": {"Fn::GetAtt": [_id(template, "AWS::KMS::Key"), "Arn"]}}
    )


def test_autoscaling_tracks_invocations_after_the_endpoint(single) -> None:
    _, _, template = single
    endpoint = _id(template, "AWS::SageMaker::Endpoint")
    template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalableTarget",
        {
            "ResourceId": {
                "Fn::Join": ["", ["endpoint/", {"Fn::GetAtt": [endpoint, "EndpointName"]}, "/variant/AllTraffic"]]
            },
            "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
            "ServiceNamespace": "sagemaker",
            "MinCapacity": AUTOSCALING.min_capacity,
            "MaxCapacity": AUTOSCALING.max_capacity,
            "RoleARN": Match.absent(),
        },
    )
    template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {
            "TargetTrackingScalingPolicyConfiguration": Match.object_like(
                {
                    "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
                    "TargetValue": AUTOSCALING.target_invocations_per_instance,
                    # Slow to scale in, quick to scale out: each cooldown where Application Auto Scaling reads it.
                    "ScaleInCooldown": AUTOSCALING.scale_in_cooldown_seconds,
                    "ScaleOutCooldown": AUTOSCALING.scale_out_cooldown_seconds,
                }
            )
        },
    )


def test_alarms_come_from_the_table_and_notify_the_encrypted_topic(single) -> None:
    _, endpoint, template = single
    topic = _id(template, "AWS::SNS::Topic")
    template.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": Match.any_value()})
    template.has_resource_properties("AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "oncall@example.com"})
    alarms = template.find_resources("AWS::CloudWatch::Alarm")
    assert len(alarms) == len(endpoint.alarms) == 2
    by_metric = {a["Properties"]["MetricName"]: a["Properties"] for a in alarms.values()}
    errors, latency = by_metric["Invocation5XXErrors"], by_metric["ModelLatency"]
    assert (errors["Threshold"], errors["EvaluationPeriods"], errors["Statistic"]) == (5, 1, "Sum")
    assert errors["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert (latency["ExtendedStatistic"], latency["Period"], latency["DatapointsToAlarm"]) == ("p99", 60, 3)
    for alarm in alarms.values():
        properties = alarm["Properties"]
        assert properties["AlarmActions"] == properties["OKActions"] == [{"Ref": topic}]
        assert properties["TreatMissingData"] == "notBreaching"
        assert {d["Name"] for d in properties["Dimensions"]} == {"EndpointName", "VariantName"}


def test_metric_helpers_name_the_variant_in_the_right_namespace(single) -> None:
    stack, endpoint, _ = single
    cases = {
        endpoint.metric_invocation5xx_errors(): ("AWS/SageMaker", "Invocation5XXErrors", "Sum"),
        endpoint.metric_model_latency(): ("AWS/SageMaker", "ModelLatency", "Average"),
        endpoint.metric_model_loading_wait_time(): ("AWS/SageMaker", "ModelLoadingWaitTime", "Average"),
        endpoint.metric_cpu_utilization(): ("/aws/sagemaker/Endpoints", "CPUUtilization", "Average"),
        endpoint.metric_mem_utilization(): ("/aws/sagemaker/Endpoints", "MemoryUtilization", "Average"),
        endpoint.metric_model_cache_hit(): ("AWS/SageMaker", "ModelCacheHit", "Average"),
    }
    for metric, (namespace, name, statistic) in cases.items():
        assert (metric.namespace, metric.metric_name, metric.statistic) == (namespace, name, statistic)
        dimensions = stack.resolve(metric.dimensions)
        assert dimensions["VariantName"] == "AllTraffic"
        assert dimensions["EndpointName"] == {"Fn::GetAtt": [stack.get_logical_id(endpoint.endpoint), "EndpointName"]}


def test_grant_invoke_allows_invoke_on_this_endpoint_only(single) -> None:
    """The grantee's policies, evaluated: invoking this endpoint, not another one, nor changing or deleting it."""
    stack, endpoint, assertions = single
    template = assertions.to_json()
    values = _values(stack, endpoint, template)
    policies = role_policies(template, logical_id(template, "AWS::IAM::Role", "Client"), values)
    this = values[f"{stack.get_logical_id(endpoint.endpoint)}.EndpointArn"]
    another = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/another"
    assert is_allowed(policies, Request("sagemaker:InvokeEndpoint", this))
    assert not is_allowed(policies, Request("sagemaker:InvokeEndpoint", another))
    for action in ("sagemaker:InvokeEndpointAsync", "sagemaker:UpdateEndpoint", "sagemaker:DeleteEndpoint"):
        assert not is_allowed(policies, Request(action, this)), action


@pytest.fixture(scope="module")
def multi_model() -> tuple[cdk.Stack, SageMakerEndpoint, dict]:
    """A multi-model endpoint whose role "Tenant" may invoke one model (grant_invoke), synthesized once."""
    stack, endpoint = endpoint_on_bare_stack(mode="MultiModel", model_data_url="s3://bucket/multi-model/")
    endpoint.grant_invoke(iam.Role(stack, "Tenant", assumed_by=iam.AccountRootPrincipal()), ["tenant-a.tar.gz"])
    return stack, endpoint, Template.from_stack(stack).to_json()


def test_invoke_statement_limits_target_models(multi_model) -> None:
    stack, endpoint, template = multi_model
    statement = stack.resolve(endpoint.invoke_statement(["tenant-a.tar.gz"]).to_statement_json())
    assert statement["Resource"] == {"Fn::GetAtt": [stack.get_logical_id(endpoint.endpoint), "EndpointArn"]}
    arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/e"
    policy = {"Statement": [{**statement, "Resource": arn}]}

    def may_invoke(context: dict[str, str]) -> bool:
        return is_allowed([policy], Request("sagemaker:InvokeEndpoint", arn, context))

    assert may_invoke({"sagemaker:TargetModel": "tenant-a.tar.gz"})
    assert not may_invoke({"sagemaker:TargetModel": "tenant-b.tar.gz"})
    assert not may_invoke({"sagemaker:TargetModel": "tenant-a-v2.tar.gz"})  # a name that starts with the allowed one
    assert not may_invoke({})  # an invocation that names no model
    with pytest.raises(ValueError, match="at least one"):
        endpoint.invoke_statement([])
    with pytest.raises(ValueError):
        endpoint.invoke_statement(["../escape.tar.gz"])
    (model,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::SageMaker::Model"]
    assert model["Properties"]["PrimaryContainer"]["Mode"] == "MultiModel"
    assert model["Properties"]["PrimaryContainer"]["ModelDataUrl"] == "s3://bucket/multi-model/"


def test_grant_invoke_with_target_models_lets_the_grantee_invoke_only_those_models(multi_model) -> None:
    """The grantee's policies, evaluated: the listed model, not another one, not one whose name starts with it, and
    not the endpoint without a TargetModel (which a multi-model endpoint answers with any model's container)."""
    stack, endpoint, template = multi_model
    values = _values(stack, endpoint, template)
    policies = role_policies(template, logical_id(template, "AWS::IAM::Role", "Tenant"), values)
    this = values[f"{stack.get_logical_id(endpoint.endpoint)}.EndpointArn"]

    def may_invoke(**context: str) -> bool:
        return is_allowed(policies, Request("sagemaker:InvokeEndpoint", this, context))

    assert may_invoke(**{"sagemaker:TargetModel": "tenant-a.tar.gz"})
    for other in ("tenant-b.tar.gz", "tenant-a-v2.tar.gz"):
        assert not may_invoke(**{"sagemaker:TargetModel": other}), other
    assert not may_invoke()


def test_a_rollout_rolls_back_on_one_to_ten_alarms() -> None:
    """AutoRollbackConfig takes 1 to 10 alarms (botocore's sagemaker model, AlarmList min 1 max 10): 11 would
    stop the deployment, not synth."""
    for count in (1, 10):
        assert len(Rollout(rollback_alarms=[f"a{n}" for n in range(count)]).rollback_alarms) == count
    for count in (0, 11):
        with pytest.raises(ValueError, match="1 to 10 alarms"):
            Rollout(rollback_alarms=[f"a{n}" for n in range(count)])


def test_dlc_image_parse() -> None:
    assert DlcImage.parse("djl-inference:0.36.0-cpu-full") == DlcImage("djl-inference", "0.36.0-cpu-full")
    with pytest.raises(ValueError, match="repository:tag"):
        DlcImage.parse("djl-inference")


# --- the alarm topic's policy -----------------------------------------------------------------------------------


def _topic_policy(template: dict, topic_id: str, values: dict) -> dict | None:
    """The policy of the topic ``topic_id`` (None: the topic has none), its references resolved."""
    policies = [resource["Properties"]["PolicyDocument"] for resource in template["Resources"].values()
                if resource["Type"] == "AWS::SNS::TopicPolicy"
                and {"Ref": topic_id} in resource["Properties"]["Topics"]]  # fmt: skip
    return resolve(policies[0], refs=values) if policies else None


def _alarms_publish(policy: dict, topic: str, account: str, region: str) -> dict[str, bool]:
    """The topic policy, evaluated for CloudWatch publishing an alarm's state change: allowed for an alarm of this
    account in this region, over TLS; each other case refused."""
    alarm = f"arn:aws:cloudwatch:{region}:{account}:alarm:dev-GravitonEndpoint-ServerErrors"

    def publishes(service: str = "cloudwatch.amazonaws.com", tls: str = "true", **keys: str) -> bool:
        context = {"aws:PrincipalServiceName": service, "aws:SecureTransport": tls,
                   **{"aws:SourceAccount": account, "aws:SourceArn": alarm, **keys}}  # fmt: skip
        context = {key: value for key, value in context.items() if value}
        return is_allowed([], Request("sns:Publish", topic, context), resource_policies=[policy])

    return {
        "alarm of this account": publishes(),
        "plain HTTP": publishes(tls="false"),
        "another service": publishes(service="events.amazonaws.com"),
        "another account": publishes(
            **{"aws:SourceAccount": OTHER_ACCOUNT, "aws:SourceArn": alarm.replace(account, OTHER_ACCOUNT)}
        ),
        "another account's alarm": publishes(**{"aws:SourceArn": alarm.replace(account, OTHER_ACCOUNT)}),
        "another region's alarm": publishes(**{"aws:SourceArn": alarm.replace(region, "eu-west-1")}),
        "not an alarm": publishes(**{"aws:SourceArn": f"arn:aws:cloudwatch:{region}:{account}:dashboard/d"}),
        "no source account": publishes(**{"aws:SourceAccount": ""}),
        "no source": publishes(**{"aws:SourceArn": ""}),
    }


ONLY_ALARMS = {"alarm of this account": True} | dict.fromkeys(
    ["plain HTTP", "another service", "another account", "another account's alarm", "another region's alarm",
     "not an alarm", "no source account", "no source"], False)  # fmt: skip


def test_cloudwatch_alarms_may_publish_to_the_topic_from_this_account_only(single) -> None:
    stack, endpoint, assertions = single
    template = assertions.to_json()
    values = {**refs(template), "AWS::AccountId": ACCOUNT}
    topic = stack.get_logical_id(endpoint.alarm_topic.node.default_child)
    policy = _topic_policy(template, topic, values)
    assert policy is not None and _alarms_publish(policy, values[topic], ACCOUNT, REGION) == ONLY_ALARMS


def test_every_alarm_topic_of_every_environment_accepts_its_alarms(templates) -> None:
    """Each environment's stacks are account-agnostic (account from the deploying credentials) or pinned to one."""
    checked = 0
    for environment, stacks in templates.items():
        settings = cdk_context()["environments"][environment]
        # (an environment without an account deploys to its credentials' account: any one, here bare_endpoint's)
        account, region = settings.get("account", ACCOUNT), settings.get("region", DEFAULT_REGION)
        for stack_name, template in stacks.items():
            values = {**refs(template), "AWS::AccountId": account}
            topics = [lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::SNS::Topic"]
            alarms = [r for r in template["Resources"].values() if r["Type"] == "AWS::CloudWatch::Alarm"]
            for topic in topics:
                where = f"{environment}/{stack_name}/{topic}"
                policy = _topic_policy(template, topic, values)
                assert policy is not None, f"{where}: CloudWatch alarms cannot publish to this topic"
                assert _alarms_publish(policy, values[topic], account, region) == ONLY_ALARMS, where
                assert all({"Ref": topic} in a["Properties"]["AlarmActions"] for a in alarms), where
                checked += 1
    assert checked >= len(templates), "every environment has at least one alarm topic"


# --- fixed name and log group -------------------------------------------------------------------------------------


def test_a_named_endpoint_gets_its_log_group_first() -> None:
    stack, endpoint = endpoint_on_bare_stack(endpoint_name="dev-Sentiment", log_retention_days=14)
    template = Template.from_stack(stack)
    group = stack.get_logical_id(endpoint.log_group.node.default_child)
    template.has_resource(
        "AWS::Logs::LogGroup",
        {
            "Properties": {
                "LogGroupName": "/aws/sagemaker/Endpoints/dev-Sentiment",
                "RetentionInDays": 14,
                "KmsKeyId": {"Fn::GetAtt": [_id(template, "AWS::KMS::Key"), "Arn"]},
            },
            "DeletionPolicy": "RetainExceptOnCreate",
            "UpdateReplacePolicy": "Retain",
        },
    )
    template.has_resource(
        "AWS::SageMaker::Endpoint",
        {"Properties": Match.object_like({"EndpointName": "dev-Sentiment"}), "DependsOn": Match.array_with([group])},
    )
    # Deleted after the ENI wait, when no instance can write to it any more.
    template.has_resource("Custom::EniReleaseWait", {"DependsOn": Match.array_with([group])})


def test_an_unnamed_endpoint_has_no_log_group(single) -> None:
    _, endpoint, template = single
    assert endpoint.log_group is None
    names = [g["Properties"].get("LogGroupName") for g in template.find_resources("AWS::Logs::LogGroup").values()]
    assert names == [None], "only the ENI wait's own (generated) log group"


@pytest.mark.parametrize(
    ("stack_name", "expected"),
    [("dev-GravitonEndpoint", "dev-GravitonEndpoint"), ("PromotionPipeline-dev-X-", "PromotionPipeline-dev-X")],
)
def test_endpoint_names_follow_the_stack_name_in_sagemakers_alphabet(stack_name: str, expected: str) -> None:
    assert endpoint_name_for(cdk.Stack(cdk.App(), "S", stack_name=stack_name)) == expected


def test_long_endpoint_names_are_cut_with_a_hash() -> None:
    first = endpoint_name_for(cdk.Stack(cdk.App(), "S", stack_name="x" * 70 + "-One"))
    second = endpoint_name_for(cdk.Stack(cdk.App(), "S", stack_name="x" * 70 + "-Two"))
    assert len(first) == len(second) == 63 and first != second
