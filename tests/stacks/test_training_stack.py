"""TrainingStack templates of dev (single node) and staging/prod (2 nodes, EFA), synthesized once per session."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from aws_cdk.assertions import Match, Template
from sagemaker.core.config.config_schema import SAGEMAKER_PYTHON_SDK_CONFIG_SCHEMA

from platform_facts.images import TrainingPlatform, image_facts, training_images
from platform_facts.instances import has_local_nvme
from stacks.settings import TrainingSettings, parse_environment
from stacks.training import remote_function_config
from tests.conftest import cdk_context
from tests.stacks.components.bare_stack import launch_data, resources
from training_assets.remote_train import image_python

ENVIRONMENTS = ("dev", "staging", "prod")
ROOT = Path(__file__).resolve().parents[2]
# What cdk.json asks of each environment's training: the templates must carry it.
TRAINING = {name: parse_environment(name, cdk_context()["environments"][name]).training for name in ENVIRONMENTS}


def _newest_training_image(image: str, platform: TrainingPlatform) -> None:
    """``image`` (repository:tag) is a training DLC of the image table for ``platform``, and of those the one patched
    longest: what a run starts on is the table's newest image, not a tag copied somewhere."""
    fact = image_facts()[image]
    assert fact.training is not None and fact.training.platform == platform, image
    ends = [f.end_of_patching for f in training_images(platform) if f.end_of_patching]
    assert fact.end_of_patching == max(ends), image


def _user_data(template: dict) -> str:
    """The user data script with every CloudFormation reference written as <ref>."""
    parts = launch_data(template)["UserData"]["Fn::Base64"]["Fn::Join"][1]
    return "".join(part if isinstance(part, str) else "<ref>" for part in parts)


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_instances_require_imdsv2_and_reach_it_from_containers(training_templates, environment) -> None:
    options = launch_data(training_templates[environment])["MetadataOptions"]
    assert options == {"HttpTokens": "required", "HttpPutResponseHopLimit": 1}


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_root_volume_is_gp3_of_the_set_size_encrypted_with_the_platform_key(training_templates, environment) -> None:
    (mapping,) = launch_data(training_templates[environment])["BlockDeviceMappings"]
    ebs = mapping["Ebs"]
    assert (mapping["DeviceName"], ebs["VolumeSize"], ebs["VolumeType"]) == (
        "/dev/sda1",
        TRAINING[environment].root_volume_gib,
        "gp3",
    )
    assert ebs["Encrypted"] is True and ebs["DeleteOnTermination"] is True
    assert re.fullmatch(
        rf"{environment}-Foundation:ExportsOutputFnGetAttPlatformKey\w+Arn\w+", ebs["KmsKeyId"]["Fn::ImportValue"]
    )


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_ami_is_the_dlami_resolved_at_launch(training_templates, environment) -> None:
    image = launch_data(training_templates[environment])["ImageId"]
    assert image == f"resolve:ssm:{TrainingSettings().dlami_ssm_parameter}"


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_instance_settings(training_templates, environment) -> None:
    data = launch_data(training_templates[environment])
    assert data["InstanceType"] == TRAINING[environment].instance_type
    assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert data["Monitoring"] == {"Enabled": True} and data["EbsOptimized"] is True
    assert "KeyName" not in data, "no SSH key pair: Session Manager only"
    assert re.fullmatch(
        rf"{environment}-Foundation:ExportsOutputFnGetAttTrainingInstanceProfile\w+",
        data["IamInstanceProfile"]["Arn"]["Fn::ImportValue"],
    )
    # No public address: False on a single interface; with several (EFA) EC2 refuses the parameter altogether.
    interfaces = data["NetworkInterfaces"]
    expected = [False] if len(interfaces) == 1 else [None] * len(interfaces)
    assert [interface.get("AssociatePublicIpAddress") for interface in interfaces] == expected


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_nothing_launches_on_deploy(training_templates, environment) -> None:
    kinds = {resource["Type"] for resource in training_templates[environment]["Resources"].values()}
    assert not kinds & {
        "AWS::EC2::Instance",
        "AWS::AutoScaling::AutoScalingGroup",
        "AWS::EC2::EC2Fleet",
        "AWS::EC2::SpotFleet",
    }


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_no_inbound_from_outside(training_templates, environment) -> None:
    template = training_templates[environment]
    ((group_id, group),) = resources(template, "AWS::EC2::SecurityGroup").items()
    assert "SecurityGroupIngress" not in group["Properties"]
    (egress,) = group["Properties"]["SecurityGroupEgress"]
    assert (egress["CidrIp"], egress["IpProtocol"], egress["FromPort"], egress["ToPort"]) == (
        "0.0.0.0/0",
        "tcp",
        443,
        443,
    )
    ingress = list(resources(template, "AWS::EC2::SecurityGroupIngress").values())
    if environment == "dev":
        assert ingress == []
    else:  # EFA: all traffic, but only from the group itself
        (rule,) = ingress
        self_ref = {"Fn::GetAtt": [group_id, "GroupId"]}
        assert rule["Properties"]["SourceSecurityGroupId"] == self_ref and rule["Properties"]["GroupId"] == self_ref


def test_single_node_environment_has_one_plain_interface_and_no_placement_group(training_templates) -> None:
    template = training_templates["dev"]
    (interface,) = launch_data(template)["NetworkInterfaces"]
    assert "InterfaceType" not in interface and interface["DeviceIndex"] == 0
    assert "Placement" not in launch_data(template)
    assert not resources(template, "AWS::EC2::PlacementGroup")
    assert "RunMultiNodeTrainingCommand" not in template["Outputs"]


@pytest.mark.parametrize("environment", ["staging", "prod"])
def test_efa_uses_four_network_cards_in_a_cluster_placement_group(training_templates, environment) -> None:
    template = training_templates[environment]
    interfaces = launch_data(template)["NetworkInterfaces"]
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == [
        (0, 0, "efa"),
        (1, 1, "efa"),
        (2, 1, "efa"),
        (3, 1, "efa"),
    ]
    assert len({json.dumps(i["SubnetId"]) for i in interfaces}) == 1, "one subnet: one AZ for the cluster"
    ((group_name, group),) = resources(template, "AWS::EC2::PlacementGroup").items()
    assert group["Properties"]["Strategy"] == "cluster"
    assert launch_data(template)["Placement"] == {"GroupName": {"Fn::GetAtt": [group_name, "GroupName"]}}
    assert "EFA=true" in _user_data(template)


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_run_commands_in_outputs(training_templates, environment) -> None:
    outputs = training_templates[environment]["Outputs"]

    def command(name: str) -> str:
        parts = outputs[name]["Value"]["Fn::Join"][1]
        return "".join(p if isinstance(p, str) else f"<{json.dumps(p)}>" for p in parts)

    single = command("RunSingleNodeTrainingCommand")
    # The command asks the platform's launcher (nobody else may RunInstances with the template).
    match = re.fullmatch(
        r'aws lambda invoke --region us-west-2 --function-name <\{"Ref": "(TrainingLauncherFunction\w+)"\}> '
        r"--cli-binary-format raw-in-base64-out --payload '(.+)' /dev/stdout",
        single,
    )
    assert match and json.loads(match[2]) == {"run_name": "RUN_NAME", "nodes": 1}
    if environment != "dev":
        assert command("RunMultiNodeTrainingCommand") == single.replace('"nodes": 1', '"nodes": 2')
    function = training_templates[environment]["Resources"][match[1]]
    template_ref = function["Properties"]["Environment"]["Variables"]["LAUNCH_TEMPLATE_ID"]["Ref"]
    assert outputs["LaunchTemplateId"]["Value"] == {"Ref": template_ref}


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_user_data_trains_packages_ships_logs_and_powers_off(training_templates, environment) -> None:
    script = _user_data(training_templates[environment])
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash" and lines[1] == "set -euo pipefail"
    # The power-off is armed before anything that can fail, and a hard stop bounds a hung run.
    trap = next(i for i, line in enumerate(lines) if line.startswith("trap "))
    assert trap < next(i for i, line in enumerate(lines) if "aws s3 cp" in line)
    assert lines[trap].endswith("shutdown -h now' EXIT") and "ship_logs.py" in lines[trap]
    assert "shutdown -h +1440 " in script
    # The global batch of one p4d node (32 x 8 GPUs) whatever the node count: 2 nodes take 16 per GPU.
    assert (
        "export TRAIN_ARGS='--epochs 3 --per-device-batch-size 32 --learning-rate 2e-05 --max-seq-length 128 "
        "--seed 42 --torch-compile --bf16 --fused-adamw --global-batch-size 256 --checkpoint-steps 5000 "
        "--collective-timeout 300'" in script
    )
    for line in ("export LOCAL_NVME=true", "export RENDEZVOUS_TIMEOUT=600", "export MAX_RESTARTS=2",
                 "export TRAINING_IMAGE_URI=''"):  # fmt: skip
        assert line in lines, line
    assert "export DATASET=tweet_eval:sentiment" in script
    assert "export BASE_MODEL=cardiffnlp/twitter-roberta-base-sentiment-latest" in script
    exported = dict(shlex.split(line)[1].split("=", 1) for line in lines if line.startswith("export "))
    # Every variable ec2_run.sh requires is exported (it stops on the first one missing).
    required = re.findall(r"\$\{(\w+):\?\}", (ROOT / "training_assets/instance/ec2_run.sh").read_text())
    assert "DLC_REPOSITORY" in required and set(required) <= set(exported)
    _newest_training_image(f"{exported['DLC_REPOSITORY']}:{exported['IMAGE_TAG']}", "ec2")
    assert "export OUTPUT_PREFIX=training-output/" in script
    assert "PACKAGE_ARGS" not in script  # the Graviton image holds every dependency: the archive vendors nothing
    assert "python3 -m zipfile -e code.zip training_assets/instance && rm code.zip" in script
    assert "python3 -m zipfile -e code.zip inference_assets && rm code.zip" in script
    assert lines[-1] == "bash training_assets/instance/ec2_run.sh"


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_training_log_group_is_encrypted_with_retention(training_templates, environment) -> None:
    Template.from_json(training_templates[environment]).has_resource_properties(
        "AWS::Logs::LogGroup",
        {
            "RetentionInDays": {"dev": 30, "staging": 90, "prod": 365}[environment],  # cdk.json logs.retention_days
            "KmsKeyId": {"Fn::ImportValue": Match.string_like_regexp("PlatformKey")},
        },
    )


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_instance_policy_is_scoped_to_this_stack(training_templates, environment) -> None:
    template = training_templates[environment]
    policies = resources(template, "AWS::IAM::Policy")
    (policy,) = [p for name, p in policies.items() if name.startswith("TrainingInstance")]
    properties = policy["Properties"]
    assert re.fullmatch(
        rf"{environment}-Foundation:ExportsOutputRefTrainingInstanceRole\w+", properties["Roles"][0]["Fn::ImportValue"]
    )
    statements = {s["Sid"]: s for s in properties["PolicyDocument"]["Statement"]}
    assert set(statements) == {"ReadTrainingCode", "WriteTrainingLogs", "FindTheNodesOfARun"}
    for statement in statements.values():
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert all("*" not in action for action in actions)
    assert statements["FindTheNodesOfARun"]["Action"] == "ec2:DescribeInstances"


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_launcher_policy_only_invokes_the_launcher_which_alone_launches(training_templates, environment) -> None:
    """People's policy: lambda:InvokeFunction on the launcher, nothing else; the launcher's role holds the launch."""
    policies = resources(training_templates[environment], "AWS::IAM::ManagedPolicy")
    (people,) = [p for name, p in policies.items() if name.startswith("TrainingLauncherPolicy")]
    (invoke,) = people["Properties"]["PolicyDocument"]["Statement"]
    assert invoke["Action"] == "lambda:InvokeFunction"
    assert invoke["Resource"]["Fn::GetAtt"][0].startswith("TrainingLauncherFunction")
    (launcher,) = [p for name, p in policies.items() if name.startswith("TrainingLauncherLaunchPolicy")]
    statements = {s["Sid"]: s for s in launcher["Properties"]["PolicyDocument"]["Statement"]}
    run = statements["RunFromTheTrainingTemplate"]
    assert run["Action"] == "ec2:RunInstances" and "ec2:LaunchTemplate" in run["Condition"]["ArnLike"]
    assert statements["PassTheTrainingInstanceRole"]["Condition"] == {
        "StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}
    }
    assert "kms:ViaService" in statements["EncryptTheRootVolume"]["Condition"]["StringEquals"]
    assert launcher["Properties"]["Roles"] == [{"Ref": next(n for n in resources(
        training_templates[environment], "AWS::IAM::Role") if n.startswith("TrainingLauncherRole"))}]  # fmt: skip


# ------------------------------------------------------------------------------------------------------- @remote

CONCRETE = {
    "RoleArn": "arn:aws:iam::123456789012:role/dev-Foundation-RemoteJobRoleNlp-ABC",
    "RemoteJobsBucket": "dev-foundation-remotejobs-abc",
    "KeyArn": "arn:aws:kms:us-west-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    "SecurityGroupId": "sg-0123456789abcdef0",
    "Subnet0": "subnet-0123456789abcdef0",
    "Subnet1": "subnet-0123456789abcdef1",
    "Subnet2": "subnet-0123456789abcdef2",
    "DlcAccount": "763104351884",
    "AWS::Region": "us-west-2",
    "AWS::URLSuffix": "amazonaws.com",
}


def _rendered_config(template: dict, caller: str) -> dict:
    """``caller``'s SSM parameter's YAML as CloudFormation would write it, with concrete values for the references."""
    (parameter,) = [p for name, p in resources(template, "AWS::SSM::Parameter").items()
                    if name.startswith(f"RemoteFunctionConfig{caller.capitalize()}")]  # fmt: skip
    body, references = parameter["Properties"]["Value"]["Fn::Sub"]
    names = set(re.findall(r"\$\{([^}]+)\}", body))
    assert names <= set(CONCRETE), names - set(CONCRETE)
    assert names - {"AWS::Region", "AWS::URLSuffix"} == set(references)
    return yaml.safe_load(re.sub(r"\$\{([^}]+)\}", lambda m: CONCRETE[m[1]], body))


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_generated_remote_config_validates_against_the_sdk_schema(training_templates, environment) -> None:
    callers = TRAINING[environment].remote_callers
    assert len(resources(training_templates[environment], "AWS::SSM::Parameter")) == len(callers)  # one per caller
    caller = callers[-1]
    config = _rendered_config(training_templates[environment], caller)
    jsonschema.validate(config, SAGEMAKER_PYTHON_SDK_CONFIG_SCHEMA)
    remote = config["SageMaker"]["PythonSDK"]["Modules"]["RemoteFunction"]
    assert remote["RoleArn"] == CONCRETE["RoleArn"]
    assert remote["S3RootUri"] == f"s3://dev-foundation-remotejobs-abc/jobs/{caller}"
    assert remote["S3KmsKeyId"] == CONCRETE["KeyArn"]
    # cdk.json's remote instance type has NVMe instance storage: SageMaker refuses a volume key there.
    assert has_local_nvme(TRAINING[environment].remote_instance_type)
    assert "VolumeKmsKeyId" not in remote
    session = config["SageMaker"]["PythonSDK"]["Modules"]["Session"]
    assert session == {"DefaultS3Bucket": "dev-foundation-remotejobs-abc", "DefaultS3ObjectKeyPrefix": f"jobs/{caller}"}
    assert remote["VpcConfig"]["SecurityGroupIds"] == ["sg-0123456789abcdef0"]
    assert remote["VpcConfig"]["Subnets"][0] == "subnet-0123456789abcdef0"
    assert remote["InstanceType"] == TRAINING[environment].remote_instance_type
    registry, _, image = remote["ImageUri"].partition("/")
    assert registry == "763104351884.dkr.ecr.us-west-2.amazonaws.com"  # the region's DLC account
    _newest_training_image(image, "sagemaker")
    # The Python a caller needs is the table's fact for that image (its tag spells none).
    fact = image_facts()[image]
    assert fact.training and image_python(remote["ImageUri"]) == fact.training.python
    assert {"Key": "environment", "Value": environment} in remote["Tags"]
    assert {"Key": "remote-job-owner", "Value": caller} in remote["Tags"]
    assert remote["Dependencies"] == "training_assets/requirements-remote.txt"


def test_the_schema_check_rejects_the_seeds_flat_vpc_keys() -> None:
    config = remote_function_config(
        caller="nlp",
        role_arn=CONCRETE["RoleArn"],
        bucket_name="dev-remote-jobs",
        kms_key_id=CONCRETE["KeyArn"],
        security_group_ids=["sg-0123456789abcdef0"],
        subnets=["subnet-0123456789abcdef0"],
        tags={"a": "b"},
        instance_type="ml.g5.2xlarge",
        image_uri=f"763104351884.dkr.ecr.us-west-2.amazonaws.com/{TrainingSettings().remote_image.image}",
    )
    jsonschema.validate(config, SAGEMAKER_PYTHON_SDK_CONFIG_SCHEMA)
    remote = config["SageMaker"]["PythonSDK"]["Modules"]["RemoteFunction"]
    remote.update(remote.pop("VpcConfig"))  # the flat SecurityGroupIds/Subnets of AWS's @remote blog post
    with pytest.raises(jsonschema.ValidationError, match="Additional properties are not allowed"):
        jsonschema.validate(config, SAGEMAKER_PYTHON_SDK_CONFIG_SCHEMA)


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_config_can_be_fetched_in_one_command(training_templates, environment) -> None:
    for caller in TRAINING[environment].remote_callers:
        output = training_templates[environment]["Outputs"][f"FetchRemoteFunctionConfigCommand{caller.capitalize()}"]
        parts = output["Value"]["Fn::Join"][1]
        assert parts[0] == "aws ssm get-parameter --region us-west-2 --name "
        assert parts[2] == " --query Parameter.Value --output text > config.yaml"


# ------------------------------------------------------------------------------------------------- GPU capacity


def test_runs_start_in_the_configured_subnet_and_the_outputs_say_where(training_templates) -> None:
    import aws_cdk as cdk

    from stacks.foundation import FoundationStack
    from stacks.settings import parse_environment
    from stacks.training import TrainingStack

    raw = cdk_context()["environments"]["dev"]
    settings = parse_environment("dev", {**raw, "training": {**raw["training"], "subnet_index": 1}})
    stage = cdk.Stage(cdk.App(context=cdk_context()), "dev", env=cdk.Environment(region="us-west-2"))
    foundation = FoundationStack(stage, "Foundation", settings=settings)
    template = Template.from_stack(TrainingStack(stage, "Training", settings=settings, foundation=foundation)).to_json()

    for chosen, index, subnet in ((template, 1, "PrivateSubnet2"), (training_templates["dev"], 0, "PrivateSubnet1")):
        (interface,) = launch_data(chosen)["NetworkInterfaces"]
        assert subnet in interface["SubnetId"]["Fn::ImportValue"]
        (launcher,) = [p for name, p in resources(chosen, "AWS::IAM::ManagedPolicy").items()
                       if name.startswith("TrainingLauncherLaunchPolicy")]  # fmt: skip
        subnets = set(re.findall(r"ExportsOutputRefVpc\w+Subnet\w+", json.dumps(launcher["Properties"])))
        assert {f"dev-Foundation:{name}" for name in subnets} == {interface["SubnetId"]["Fn::ImportValue"]}, (
            "the launch grant names the same subnet only"
        )
        zone = {"Fn::Select": [index, {"Fn::GetAZs": ""}]}
        outputs = chosen["Outputs"]
        assert outputs["TrainingAvailabilityZone"]["Value"] == zone
        check = outputs["CheckTrainingCapacityCommand"]["Value"]["Fn::Join"][1]
        assert check[0].startswith("aws ec2 describe-instance-type-offerings --region us-west-2 ")
        assert "Name=instance-type,Values=p4d.24xlarge Name=location,Values=" in check[0] and check[1] == zone
