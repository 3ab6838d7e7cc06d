"""SageMakerEndpoint and DlcImage on a bare cdk.Stack: what each builds, independent of the platform's stacks."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Match, Template

from proving_ground.iam_policy import Request, is_allowed
from stacks.components.sagemaker_endpoint import (
    AlarmSpec,
    DlcImage,
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


def test_the_image_grants_the_pull_of_exactly_its_own_repository(single) -> None:
    _, _, template = single
    template.has_resource_properties(
        "AWS::IAM::ManagedPolicy",
        {
            "Roles": [{"Ref": Match.string_like_regexp("^Role")}],
            "PolicyDocument": {
                "Statement": [
                    {
                        "Action": [
                            "ecr:BatchCheckLayerAvailability",
                            "ecr:BatchGetImage",
                            "ecr:GetDownloadUrlForLayer",
                        ],
                        "Effect": "Allow",
                        "Resource": "arn:aws:ecr:us-west-2:763104351884:repository/pytorch-inference-arm64",
                        "Sid": "PullModelImage",
                    }
                ],
                "Version": "2012-10-17",
            },
        },
    )


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
    stack, endpoint, template = single
    template.has_resource_properties(
        "AWS::IAM::Policy",
        {
            "PolicyDocument": Match.object_like(
                {
                    "Statement": [
                        {
                            "Action": "sagemaker:InvokeEndpoint",
                            "Effect": "Allow",
                            "Resource": {"Fn::GetAtt": [stack.get_logical_id(endpoint.endpoint), "EndpointArn"]},
                        }
                    ]
                }
            )
        },
    )


def test_invoke_statement_limits_target_models() -> None:
    stack, endpoint = endpoint_on_bare_stack(mode="MultiModel", model_data_url="s3://bucket/multi-model/")
    statement = stack.resolve(endpoint.invoke_statement(["tenant-a.tar.gz"]).to_statement_json())
    assert statement["Resource"] == {"Fn::GetAtt": [stack.get_logical_id(endpoint.endpoint), "EndpointArn"]}
    arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/e"
    policy = {"Statement": [{**statement, "Resource": arn}]}

    def may_invoke(context: dict[str, str]) -> bool:
        return is_allowed([policy], Request("sagemaker:InvokeEndpoint", arn, context))

    assert may_invoke({"sagemaker:TargetModel": "tenant-a.tar.gz"})
    assert not may_invoke({"sagemaker:TargetModel": "tenant-b.tar.gz"})
    assert not may_invoke({})  # an invocation that names no model
    with pytest.raises(ValueError, match="at least one"):
        endpoint.invoke_statement([])
    with pytest.raises(ValueError):
        endpoint.invoke_statement(["../escape.tar.gz"])
    Template.from_stack(stack).has_resource_properties(
        "AWS::SageMaker::Model",
        {"PrimaryContainer": Match.object_like({"Mode": "MultiModel", "ModelDataUrl": "s3://bucket/multi-model/"})},
    )


def test_dlc_image_parse() -> None:
    assert DlcImage.parse("djl-inference:0.36.0-cpu-full") == DlcImage("djl-inference", "0.36.0-cpu-full")
    with pytest.raises(ValueError, match="repository:tag"):
        DlcImage.parse("djl-inference")


# --- the alarm topic's policy -----------------------------------------------------------------------------------


def _alarm_publish_statements(template: dict, topic_id: str) -> list[dict]:
    """Allow statements for cloudwatch.amazonaws.com sns:Publish in the TopicPolicy that covers ``topic_id``."""
    found = []
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::SNS::TopicPolicy" or {"Ref": topic_id} not in resource["Properties"]["Topics"]:
            continue
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Effect"] == "Allow" and statement.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}:
                found.append(statement)
    return found


def _expected_alarm_statement(topic_id: str, account: object, region: str) -> dict:
    return {
        "Action": "sns:Publish",
        "Effect": "Allow",
        "Principal": {"Service": "cloudwatch.amazonaws.com"},
        "Resource": {"Ref": topic_id},
        "Sid": "AllowCloudWatchAlarmsToPublish",
        "Condition": {
            "StringEquals": {"aws:SourceAccount": account},
            "ArnLike": {
                "aws:SourceArn": {"Fn::Join": ["", [f"arn:aws:cloudwatch:{region}:", account, ":alarm:*"]]}
                if isinstance(account, dict)
                else f"arn:aws:cloudwatch:{region}:{account}:alarm:*"
            },
        },
    }


def test_cloudwatch_alarms_may_publish_to_the_topic_from_this_account_only(single) -> None:
    stack, endpoint, _ = single
    template = Template.from_stack(stack).to_json()
    topic = stack.get_logical_id(endpoint.alarm_topic.node.default_child)
    assert _alarm_publish_statements(template, topic) == [_expected_alarm_statement(topic, ACCOUNT, REGION)]


def test_every_alarm_topic_of_every_environment_accepts_its_alarms(templates) -> None:
    """Each environment's stacks are account-agnostic (account from the deploying credentials) or pinned to one."""
    checked = 0
    for environment, stacks in templates.items():
        for stack_name, template in stacks.items():
            topics = [lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::SNS::Topic"]
            alarms = [r for r in template["Resources"].values() if r["Type"] == "AWS::CloudWatch::Alarm"]
            for topic in topics:
                where = f"{environment}/{stack_name}/{topic}"
                (statement,) = _alarm_publish_statements(template, topic) or [None]
                assert statement is not None, f"{where}: CloudWatch alarms cannot publish to this topic"
                account = statement["Condition"]["StringEquals"]["aws:SourceAccount"]
                assert account in ({"Ref": "AWS::AccountId"},) or str(account).isdigit(), where
                region = cdk_context()["environments"][environment].get("region", DEFAULT_REGION)
                assert statement == _expected_alarm_statement(topic, account, region), where
                # The topic policy keeps the TLS-only Deny next to the Allow.
                policy = next(
                    r
                    for r in template["Resources"].values()
                    if r["Type"] == "AWS::SNS::TopicPolicy" and {"Ref": topic} in r["Properties"]["Topics"]
                )
                assert any(
                    s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
                    for s in policy["Properties"]["PolicyDocument"]["Statement"]
                ), where
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
