"""The Graviton endpoint stack of every environment, from the session's synthesized app, plus variants of the
settings (alarm e-mail, workers, instance types) built in one extra app for this module."""

from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Match, Template

from app import build_app
from ops_review.iam_policy import resolve
from stacks.compliance import add_compliance_gates
from stacks.components.image_builds import IMAGE_BY_DIGEST, PULL_ACTIONS
from stacks.components.sagemaker_endpoint import DlcImage
from stacks.foundation import FoundationStack
from stacks.graviton_endpoint import CPU_UTILIZATION_PERCENT, GravitonEndpointStack, image_source
from stacks.image_patching import SERVING_IMAGE
from stacks.platform_stage import no_model_yet
from stacks.settings import parse_environment
from tests.conftest import cdk_context

ROOT = Path(__file__).resolve().parents[2]
ENVIRONMENTS = ["dev", "staging", "prod"]
MODEL_KEY = "endpoints/sentiment/model-v7.tar.gz"

# vCPUs of the Graviton types cdk.json names (https://docs.aws.amazon.com/ec2/latest/instancetypes/co.html).
VCPUS = {"ml.c7g.xlarge": 4, "ml.c7g.4xlarge": 16}


def _with_model(environments: dict, name: str) -> dict:
    """An environment's settings, naming MODEL_KEY where cdk.json names no model version."""
    raw = json.loads(json.dumps(environments[name]))
    raw["graviton_endpoint"].setdefault("model_data_key", MODEL_KEY)
    return raw


RAW = cdk_context()["environments"]
SETTINGS = {name: parse_environment(name, _with_model(RAW, name)) for name in RAW}


def resources(template: dict, resource_type: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == resource_type}


def only(template: dict, resource_type: str) -> dict:
    (resource,) = resources(template, resource_type).values()
    return resource["Properties"]


def only_resource(template: dict, resource_type: str) -> dict:
    (resource,) = resources(template, resource_type).values()
    return resource


def imports(value: object, fragment: str) -> bool:
    """Whether ``value`` is an Fn::ImportValue of the foundation export whose name contains ``fragment``."""
    return isinstance(value, dict) and fragment in value.get("Fn::ImportValue", "")


@pytest.fixture(scope="module", params=ENVIRONMENTS)
def env(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def dev_with_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """dev's stacks once its settings name a model (cdk.json's dev names none: the first-deploy path)."""
    context = cdk_context(env="dev")
    context["environments"] = {**context["environments"], "dev": _with_model(context["environments"], "dev")}
    (stage,) = build_app(context=context, outdir=str(tmp_path_factory.mktemp("dev-model"))).synth().nested_assemblies
    return {stack.hierarchical_id.split("/")[-1]: stack.template for stack in stage.nested_assembly.stacks}


@pytest.fixture(scope="module")
def env_templates(templates, dev_with_model, env: str) -> dict[str, dict]:
    return dev_with_model if env == "dev" else templates[env]


@pytest.fixture(scope="module")
def endpoint_template(env_templates: dict[str, dict]) -> dict:
    return env_templates["GravitonEndpoint"]


def _image_parameter(template: dict) -> str:
    """The logical id of the template parameter that reads the serving image's digest from SSM."""
    (name,) = [
        name
        for name, parameter in template.get("Parameters", {}).items()
        if parameter["Type"] == "AWS::SSM::Parameter::Value<String>"
        and parameter["Default"] == f"/pytorch-platform/images/{SERVING_IMAGE}"
    ]
    return name


def test_model_runs_the_platform_image_by_the_digest_promoted_to_the_environment(
    endpoint_template: dict, env: str
) -> None:
    """No DLC and no tag: the image is the digest the pipeline wrote into the environment's parameter (SSM refuses
    anything but an ECR image by digest there), resolved when the stack deploys."""
    settings = SETTINGS[env].graviton_endpoint
    container = only(endpoint_template, "AWS::SageMaker::Model")["PrimaryContainer"]
    assert container["Image"] == {"Ref": _image_parameter(endpoint_template)}
    assert "763104351884" not in json.dumps(endpoint_template), "no Deep Learning Container left"
    assert IMAGE_BY_DIGEST.endswith("@sha256:[0-9a-f]{64}$")
    assert container["Mode"] == "SingleModel"
    url = container["ModelDataUrl"]["Fn::Join"][1]
    assert url[0] == "s3://" and imports(url[1], "Artifacts") and url[2] == f"/{settings.model_data_key}"


def test_model_uses_the_foundation_role_in_the_private_subnets_network_isolated(endpoint_template: dict) -> None:
    model = only(endpoint_template, "AWS::SageMaker::Model")
    assert imports(model["ExecutionRoleArn"], "EndpointExecutionRole")
    assert model["EnableNetworkIsolation"] is True, "the image holds every dependency: no network needed"
    assert all(imports(subnet, "PrivateSubnet") for subnet in model["VpcConfig"]["Subnets"])
    (group,) = model["VpcConfig"]["SecurityGroupIds"]
    assert imports(group, "WorkloadSecurityGroup")


def test_ray_replicas_and_threads_fill_the_instance_with_the_graviton_runtime_settings(
    endpoint_template: dict, env: str
) -> None:
    """The container contract of the Ray Serve image: what ray_settings.py and the predictor read, the Graviton
    runtime settings the DLC used to carry, and nothing of the TorchServe toolkit."""
    settings = SETTINGS[env].graviton_endpoint
    environment = only(endpoint_template, "AWS::SageMaker::Model")["PrimaryContainer"]["Environment"]
    replicas = int(environment["SENTIMENT_SERVE_REPLICAS"])
    # Threads are set (Ray would set OMP_NUM_THREADS=1 where unset): replicas x threads = the instance's vCPUs.
    assert replicas * int(environment["OMP_NUM_THREADS"]) == VCPUS[settings.instance_type]
    assert environment["OMP_WAIT_POLICY"] == "PASSIVE", "spinning OpenMP threads starve Ray's proxy"
    assert environment["SENTIMENT_SERVE_MAX_BATCH_SIZE"] == str(settings.server_batch_size)
    assert float(environment["SENTIMENT_SERVE_BATCH_WAIT_TIMEOUT_S"]) == settings.server_max_batch_delay_ms / 1000
    assert environment["SENTIMENT_MAX_REQUEST_BATCH"] == str(settings.max_request_batch)
    assert environment["LRU_CACHE_CAPACITY"] == str(settings.lru_cache_capacity)
    assert environment["THP_MEM_ALLOC_ENABLE"] == ("1" if settings.transparent_huge_pages else "0")
    assert not [name for name in environment if name.startswith(("SAGEMAKER_", "TS_"))]


def test_endpoint_config_is_encrypted_with_the_platform_key(endpoint_template: dict, env: str) -> None:
    settings = SETTINGS[env].graviton_endpoint
    config = only(endpoint_template, "AWS::SageMaker::EndpointConfig")
    assert imports(config["KmsKeyId"], "PlatformKey")
    assert "EndpointConfigName" not in config, "endpoint configs are immutable: let CloudFormation name them"
    (variant,) = config["ProductionVariants"]
    assert variant["InstanceType"] == settings.instance_type
    assert variant["InitialInstanceCount"] == settings.initial_instance_count
    assert variant["ModelName"] == {"Fn::GetAtt": ["Model", "ModelName"]}


def test_data_capture_follows_the_setting_and_is_encrypted(endpoint_template: dict, env: str) -> None:
    capture_settings = SETTINGS[env].graviton_endpoint.data_capture
    capture = only(endpoint_template, "AWS::SageMaker::EndpointConfig").get("DataCaptureConfig")
    if not capture_settings.enabled:
        assert capture is None
        return
    assert capture["EnableCapture"] is True
    assert capture["InitialSamplingPercentage"] == capture_settings.sampling_percentage
    assert imports(capture["KmsKeyId"], "PlatformKey")
    destination = capture["DestinationS3Uri"]["Fn::Join"][1]
    assert imports(destination[1], "Artifacts") and destination[2].startswith("/data-capture/")
    assert {option["CaptureMode"] for option in capture["CaptureOptions"]} == {"Input", "Output"}


def test_endpoint_updates_in_place_keeping_the_scaled_instance_count(endpoint_template: dict, env: str) -> None:
    endpoint = only(endpoint_template, "AWS::SageMaker::Endpoint")
    # A fixed name (for its log group); only a name change replaces an endpoint, config changes update it in place.
    assert endpoint["EndpointName"] == f"{env}-GravitonEndpoint"
    assert endpoint["EndpointConfigName"] == {"Fn::GetAtt": ["EndpointConfig", "EndpointConfigName"]}
    assert endpoint["RetainAllVariantProperties"] is True
    assert endpoint["ExcludeRetainedVariantProperties"] == [{"VariantPropertyType": "DataCaptureConfig"}]


def test_updates_roll_out_blue_green_and_roll_back_on_errors_or_queueing(endpoint_template: dict, env: str) -> None:
    """A new endpoint config (model, image, instance type) goes to a new fleet with all traffic at once, then bakes
    while the 5xx and latency alarms watch it; either in alarm rolls back to the old fleet. The bake covers the
    latency alarm's three 5-minute periods, so it can fire before the old fleet goes."""
    endpoint = only(endpoint_template, "AWS::SageMaker::Endpoint")
    alarms = {
        a["Properties"]["MetricName"]: alarm_id
        for alarm_id, a in resources(endpoint_template, "AWS::CloudWatch::Alarm").items()
    }
    config = endpoint["DeploymentConfig"]
    assert config["AutoRollbackConfiguration"] == {
        "Alarms": [
            {"AlarmName": {"Ref": alarms["Invocation5XXErrors"]}},
            {"AlarmName": {"Ref": alarms["ModelLatency"]}},
        ]
    }
    policy = config["BlueGreenUpdatePolicy"]
    assert policy["TrafficRoutingConfiguration"] == {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 900}
    assert (
        policy["MaximumExecutionTimeoutInSeconds"]
        >= 900 + SETTINGS[env].graviton_endpoint.container_startup_timeout_seconds
    )


def test_sagemaker_waits_for_the_replicas_as_long_as_the_settings_say(endpoint_template: dict, env: str) -> None:
    (variant,) = only(endpoint_template, "AWS::SageMaker::EndpointConfig")["ProductionVariants"]
    expected = SETTINGS[env].graviton_endpoint.container_startup_timeout_seconds
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == expected == 600


def test_requests_go_to_the_instance_with_the_fewest_in_flight(endpoint_template: dict, env: str) -> None:
    """Staging and prod run several small instances (docs/serving.md): SageMaker balances them, by outstanding
    requests rather than at random."""
    (variant,) = only(endpoint_template, "AWS::SageMaker::EndpointConfig")["ProductionVariants"]
    assert variant["RoutingConfig"] == {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
    assert variant["InstanceType"] == SETTINGS[env].graviton_endpoint.instance_type
    if env != "dev":
        assert (variant["InstanceType"], variant["InitialInstanceCount"]) == ("ml.c7g.xlarge", 8)


def test_scalable_target_names_the_variant_of_this_endpoint_and_comes_after_it(
    endpoint_template: dict, env: str
) -> None:
    scaling = SETTINGS[env].graviton_endpoint.autoscaling
    target = only(endpoint_template, "AWS::ApplicationAutoScaling::ScalableTarget")
    assert target["ServiceNamespace"] == "sagemaker"
    assert target["ScalableDimension"] == "sagemaker:variant:DesiredInstanceCount"
    # Fn::GetAtt on the endpoint both builds the id and orders the target after the endpoint.
    assert target["ResourceId"] == {
        "Fn::Join": ["", ["endpoint/", {"Fn::GetAtt": ["Endpoint", "EndpointName"]}, "/variant/AllTraffic"]]
    }
    assert (target["MinCapacity"], target["MaxCapacity"]) == (scaling.min_capacity, scaling.max_capacity)
    assert "RoleARN" not in target, "Application Auto Scaling uses its service-linked role"
    roles = resources(endpoint_template, "AWS::IAM::Role").values()
    principals = [s["Principal"] for r in roles for s in r["Properties"]["AssumeRolePolicyDocument"]["Statement"]]
    assert principals == [{"Service": "lambda.amazonaws.com"}] * 2, "the ENI wait's and model check's; no autoscaling"


def test_target_tracking_on_invocations_per_instance(endpoint_template: dict, env: str) -> None:
    scaling = SETTINGS[env].graviton_endpoint.autoscaling
    (target_id,) = resources(endpoint_template, "AWS::ApplicationAutoScaling::ScalableTarget")
    policy = only(endpoint_template, "AWS::ApplicationAutoScaling::ScalingPolicy")
    assert policy["ScalingTargetId"] == {"Ref": target_id}
    assert policy["PolicyType"] == "TargetTrackingScaling"
    assert policy["TargetTrackingScalingPolicyConfiguration"] == {
        "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
        "TargetValue": scaling.target_invocations_per_instance,
        "ScaleInCooldown": scaling.scale_in_cooldown_seconds,
        "ScaleOutCooldown": scaling.scale_out_cooldown_seconds,
    }


def test_alarms_watch_5xx_latency_and_cpu_of_this_variant_and_notify_the_encrypted_topic(
    endpoint_template: dict, env: str
) -> None:
    topic = only(endpoint_template, "AWS::SNS::Topic")
    assert imports(topic["KmsMasterKeyId"], "PlatformKey")
    (topic_id,) = resources(endpoint_template, "AWS::SNS::Topic")
    alarms = {
        a["Properties"]["MetricName"]: a["Properties"]
        for a in resources(endpoint_template, "AWS::CloudWatch::Alarm").values()
    }
    assert set(alarms) == {"Invocation5XXErrors", "ModelLatency", "CPUUtilization"}
    for alarm in alarms.values():
        # The fixed name, not the endpoint's attribute: the endpoint's rollout names these alarms (no cycle).
        assert {d["Name"]: d["Value"] for d in alarm["Dimensions"]} == {
            "EndpointName": f"{env}-GravitonEndpoint",
            "VariantName": "AllTraffic",
        }
        assert alarm["AlarmActions"] == [{"Ref": topic_id}] == alarm["OKActions"]
    assert alarms["Invocation5XXErrors"]["Namespace"] == "AWS/SageMaker"
    assert alarms["ModelLatency"]["ExtendedStatistic"] == "p99"
    assert alarms["CPUUtilization"]["Namespace"] == "/aws/sagemaker/Endpoints"
    cpus = VCPUS[SETTINGS[env].graviton_endpoint.instance_type]
    assert alarms["CPUUtilization"]["Threshold"] == CPU_UTILIZATION_PERCENT * cpus
    assert not resources(endpoint_template, "AWS::SNS::Subscription"), "no alarm_email in cdk.json"


def test_the_endpoint_log_group_exists_first_expires_and_uses_the_platform_key(
    endpoint_template: dict, env: str
) -> None:
    (group_id,) = [
        lid
        for lid, r in resources(endpoint_template, "AWS::Logs::LogGroup").items()
        if "LogGroupName" in r["Properties"]
    ]
    group = endpoint_template["Resources"][group_id]
    assert group["Properties"]["LogGroupName"] == f"/aws/sagemaker/Endpoints/{env}-GravitonEndpoint"
    assert group["Properties"]["RetentionInDays"] == SETTINGS[env].logs.retention_days
    assert imports(group["Properties"]["KmsKeyId"], "PlatformKey")
    retain = not SETTINGS[env].destroy_on_delete
    # A failed first creation must not leave the fixed-name group behind (it would block the retry).
    assert group["DeletionPolicy"] == ("RetainExceptOnCreate" if retain else "Delete")
    assert group["UpdateReplacePolicy"] == ("Retain" if retain else "Delete")
    assert group_id in only_resource(endpoint_template, "AWS::SageMaker::Endpoint")["DependsOn"]


def test_outputs_name_the_endpoint(endpoint_template: dict) -> None:
    outputs = endpoint_template["Outputs"]
    assert outputs["EndpointName"]["Value"] == {"Fn::GetAtt": ["Endpoint", "EndpointName"]}
    assert outputs["EndpointArn"]["Value"] == {"Fn::GetAtt": ["Endpoint", "EndpointArn"]}


def test_the_execution_role_may_read_the_archive_and_pull_the_image(env_templates, env: str) -> None:
    """Role scope: the foundation's endpoint role reads exactly the model prefixes; the image grants its own pull."""
    settings = SETTINGS[env]
    foundation = env_templates["Foundation"]
    (role_id,) = [k for k in resources(foundation, "AWS::IAM::Role") if k.startswith("EndpointExecutionRole")]
    statements = [
        statement
        for policy in resources(foundation, "AWS::IAM::ManagedPolicy").values()
        if {"Ref": role_id} in policy["Properties"].get("Roles", [])
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    assert statements
    for statement in statements:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert all("*" not in action for action in actions), statement
    read = next(s for s in statements if s.get("Sid") == "ReadModelArchives")
    read_prefixes = [
        r["Fn::Join"][1][-1] for r in (read["Resource"] if isinstance(read["Resource"], list) else [read["Resource"]])
    ]
    assert any(f"/{settings.graviton_endpoint.model_data_key}".startswith(p.rstrip("*")) for p in read_prefixes)
    assert all(p.endswith("/*") and p.count("/") >= 2 for p in read_prefixes), "reads only below model prefixes"
    assert not [s for s in statements if s.get("Sid") == "PullDeepLearningContainers"], "no hand-kept repository list"
    assert any(s.get("Action") == "ecr:GetAuthorizationToken" for s in statements)
    # The image grants its own pull, in the endpoint stack, on exactly its repository.
    endpoint = env_templates["GravitonEndpoint"]
    (pull_id, pull) = next(
        (k, v) for k, v in resources(endpoint, "AWS::IAM::ManagedPolicy").items() if "ImagePull" in k
    )
    assert imports(pull["Properties"]["Roles"][0], "EndpointExecutionRole")
    (statement,) = pull["Properties"]["PolicyDocument"]["Statement"]
    # The repository of the registry the settings name (without a pipeline in cdk.json: the environment's own account
    # and region), never one the parameter's digest URI names (issue 41.5: a deployed role could write any URI).
    assert sorted(statement["Action"]) == sorted(PULL_ACTIONS)
    assert _image_parameter(endpoint) not in json.dumps(statement)
    refs = {"AWS::AccountId": "123456789012", "AWS::Partition": "aws", "AWS::Region": settings.region}
    assert resolve(statement["Resource"], refs=refs) == (
        f"arn:aws:ecr:{settings.region}:123456789012:repository/pytorch-platform/{SERVING_IMAGE}"
    )
    assert pull_id in only_resource(endpoint, "AWS::SageMaker::Model")["DependsOn"]


def test_synth_says_where_the_image_comes_from(cloud_assembly) -> None:
    """An environment without a published image fails its deploy on the missing parameter: synth says beforehand
    how the digest gets there."""
    (prod,) = [s for s in cloud_assembly.nested_assemblies if s.directory_name == "assembly-prod"]
    (stack,) = [s for s in prod.nested_assembly.stacks if s.hierarchical_id.endswith("/GravitonEndpoint")]
    messages = [m.entry.data for m in stack.messages if m.level.value == "INFO"]
    expected = image_source("prod", f"/pytorch-platform/images/{SERVING_IMAGE}")
    assert expected in messages
    assert "cdk deploy" in expected and "docs/images.md" in expected


def test_the_endpoint_stack_deploys_after_the_foundation(cloud_assembly) -> None:
    checked = 0
    for stage in cloud_assembly.nested_assemblies:
        stacks = {stack.hierarchical_id.split("/")[-1]: stack for stack in stage.nested_assembly.stacks}
        if "GravitonEndpoint" in stacks:
            assert stacks["Foundation"].id in [d.id for d in stacks["GravitonEndpoint"].dependencies]
            checked += 1
    assert checked


# --- first deploy: no model version named yet --------------------------------------------------------------------


def test_without_a_model_version_there_is_no_endpoint_stack_and_synth_says_what_to_do(cloud_assembly) -> None:
    """cdk.json's dev names no model (a new account has none): `cdk deploy 'dev/*'` builds no Graviton endpoint."""
    assert RAW["dev"]["graviton_endpoint"].get("model_data_key") is None
    (dev,) = [s for s in cloud_assembly.nested_assemblies if s.directory_name == "assembly-dev"]
    stacks = {stack.hierarchical_id.split("/")[-1]: stack for stack in dev.nested_assembly.stacks}
    assert "GravitonEndpoint" not in stacks
    assert "MultiModelEndpoint" in stacks, "a multi-model endpoint starts without models"
    messages = [m.entry.data for m in stacks["Foundation"].messages if m.level.value == "INFO"]
    assert no_model_yet("dev") in messages
    assert "environments.dev.graviton_endpoint.model_data_key names no model version" in no_model_yet("dev")
    assert "make check-model ENV=dev" in no_model_yet("dev")


def test_the_stack_itself_refuses_settings_without_a_model() -> None:
    settings = parse_environment("dev", RAW["dev"])
    stage = cdk.Stage(cdk.App(context=cdk_context()), "bare", env=cdk.Environment(region="us-west-2"))
    foundation = FoundationStack(stage, "Foundation", settings=settings)
    with pytest.raises(ValueError, match=r"graviton_endpoint\.model_data_key: the endpoint stack needs a model"):
        GravitonEndpointStack(stage, "GravitonEndpoint", settings=settings, foundation=foundation)


# --- settings variants: one extra app, synthesized once for the module -----------------------------------------


@pytest.fixture(scope="module")
def variant() -> tuple[GravitonEndpointStack, Template]:
    raw = _with_model(RAW, "dev")
    settings = parse_environment(
        "dev",
        {
            **raw,
            "alarm_email": "ml-oncall@example.com",
            "graviton_endpoint": {
                **raw["graviton_endpoint"],
                "server_batch_size": 4,
                "workers_per_model": 2,
                "instance_type": "ml.c7g.4xlarge",
            },
        },
    )
    app = cdk.App(context=cdk_context())
    stage = cdk.Stage(app, "variant", env=cdk.Environment(region="us-west-2"))
    foundation = FoundationStack(stage, "Foundation", settings=settings)
    stack = GravitonEndpointStack(stage, "GravitonEndpoint", settings=settings, foundation=foundation)
    consumer = iam.Role(stack, "Consumer", assumed_by=iam.AccountRootPrincipal())
    stack.grant_invoke(consumer)
    return stack, Template.from_stack(stack)


def test_alarm_email_subscribes_to_the_topic(variant) -> None:
    _, template = variant
    template.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ml-oncall@example.com"}
    )


def test_explicit_workers_split_the_cores(variant) -> None:
    _, template = variant
    template.has_resource_properties(
        "AWS::SageMaker::Model",
        {
            "PrimaryContainer": Match.object_like(
                {"Environment": Match.object_like({"SENTIMENT_SERVE_REPLICAS": "2", "OMP_NUM_THREADS": "8"})}
            )
        },
    )


def test_grant_invoke_allows_only_invoke_endpoint_on_this_endpoint(variant) -> None:
    _, template = variant
    template.has_resource_properties(
        "AWS::IAM::Policy",
        {
            "PolicyDocument": {
                "Statement": [
                    {
                        "Action": "sagemaker:InvokeEndpoint",
                        "Effect": "Allow",
                        "Resource": {"Fn::GetAtt": ["Endpoint", "EndpointArn"]},
                    }
                ],
                "Version": "2012-10-17",
            }
        },
    )


def _dev_stack(graviton_endpoint: dict, **settings_overrides) -> GravitonEndpointStack:
    raw = _with_model(RAW, "dev")
    settings = parse_environment(
        "dev", {**raw, **settings_overrides, "graviton_endpoint": {**raw["graviton_endpoint"], **graviton_endpoint}}
    )
    stage = cdk.Stage(cdk.App(context=cdk_context()), "single", env=cdk.Environment(region="us-west-2"))
    foundation = FoundationStack(stage, "Foundation", settings=settings)
    return GravitonEndpointStack(stage, "GravitonEndpoint", settings=settings, foundation=foundation)


def test_model_data_outside_the_endpoint_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match=r"graviton_endpoint\.model_data_key: must start with 'endpoints/'"):
        _dev_stack({"model_data_key": "models/m.tar.gz"})


def test_nvme_instance_types_get_no_kms_key_and_say_why() -> None:
    stack = _dev_stack({"instance_type": "ml.c6gd.2xlarge"})
    app = stack.node.root
    add_compliance_gates(app)
    stage_assembly = app.synth(force=True)  # the cdk-nag gates fail synth on an unacknowledged finding
    (template,) = [
        s.template for s in stage_assembly.nested_assemblies[0].nested_assembly.stacks if "GravitonEndpoint" in s.id
    ]
    (config,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::SageMaker::EndpointConfig"]
    assert "KmsKeyId" not in config["Properties"]
    assert "NVMe instance storage" in json.dumps(config["Metadata"])


@pytest.mark.parametrize(
    ("region", "registry"),
    [
        ("us-west-2", "763104351884.dkr.ecr.us-west-2.amazonaws.com"),
        ("ap-east-1", "871362719292.dkr.ecr.ap-east-1.amazonaws.com"),
        ("cn-north-1", "727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn"),
    ],
)
def test_image_uri_uses_the_regional_dlc_account_and_domain(region: str, registry: str) -> None:
    stack = cdk.Stack(cdk.App(), "Images", env=cdk.Environment(region=region))
    image = DlcImage.parse("djl-inference:0.36.0-cpu-full")  # the multi-model endpoint's DLC
    uri = stack.resolve(image.image_uri(stack))
    assert uri == f"{registry}/djl-inference:0.36.0-cpu-full"
