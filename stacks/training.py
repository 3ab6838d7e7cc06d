"""GPU training (seeds 000 and 001): the p4d launch template that runs one training job and powers off, and the
SageMaker SDK ``config.yaml`` that sends ``@remote`` functions to this environment's training jobs.

Nothing here launches an instance: a run starts with the ``aws ec2 run-instances`` command in the stack outputs.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import yaml
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_ssm as ssm
from aws_cdk import region_info
from constructs import Construct

from stacks.compliance import acknowledge, acknowledge_short_retention, acknowledge_wildcards, log_retention
from stacks.environment_stack import EnvironmentStack
from stacks.foundation import TRAINING_OUTPUT_PREFIX, FoundationStack
from stacks.settings import EnvironmentSettings, HyperParameters
from training_assets.instance_types import has_instance_storage

ROOT = Path(__file__).resolve().parents[1]
# EFA network cards per instance family (p4d.24xlarge: 4 x 100 Gbit/s); one EFA interface goes on each card.
EFA_NETWORK_CARDS = {"p3dn": 1, "p4d": 4, "p4de": 4, "p5": 32, "p5e": 32, "p5en": 16, "p6-b200": 8, "g6e": 1}
WORK_DIR = "/opt/sentiment-training"
BOOTSTRAP_LOG = "/var/log/sentiment-training.log"
# Where the data scientist's copy of the SDK config points for the job's dependencies (relative to the repo root).
REMOTE_DEPENDENCIES = "training_assets/requirements-remote.txt"
# Names the SDK must not upload when IncludeLocalWorkDir packs the working directory.
REMOTE_IGNORED_NAMES = [".venv*", "node_modules", "cdk.out", ".git", "__pycache__", "tests", "benchmarks", "*.tar.gz"]
# Key prefix of @remote jobs (S3RootUri) and of the SDK session's default bucket in the RemoteJobs bucket.
REMOTE_JOBS_PREFIX = "jobs"
# The code the training instances fetch (construct id -> folder under the repository root, folder-specific exclude
# patterns): what the instance runs, and the inference package that ec2_run.sh calls to build model.tar.gz. Local
# harnesses and test files stay out, so editing them leaves the Training stack (its asset hashes) unchanged. The
# patterns are CDK glob patterns matched against each path and its base name (a folder name drops the folder).
CODE_ASSETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "TrainingAssetsCode": ("training_assets/instance", ()),
    "InferenceAssetsCode": ("inference_assets", ("local", "tests", "test_*.py", "conftest.py", "fake_*.py")),
}
CODE_ASSET_EXCLUDE = ("__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache", "*.egg-info")


def code_asset(scope: Construct, construct_id: str, root: Path = ROOT) -> s3_assets.Asset:
    """One of ``CODE_ASSETS`` as an S3 asset (``root``: the repository, or a copy of it in tests)."""
    folder, exclude = CODE_ASSETS[construct_id]
    return s3_assets.Asset(scope, construct_id, path=str(root / folder), exclude=[*CODE_ASSET_EXCLUDE, *exclude])


def remote_function_config(
    *,
    role_arn: str,
    bucket_name: str,
    kms_key_id: str,
    security_group_ids: list[str],
    subnets: list[str],
    tags: dict[str, str],
    instance_type: str,
    image_uri: str,
) -> dict[str, Any]:
    """The SageMaker Python SDK config (``config.yaml``) that runs ``@remote`` functions in this environment."""
    # SageMaker refuses VolumeKmsKeyId for types with NVMe instance storage (p4d, p5, g5, ...): it encrypts those
    # with a hardware key. remote_train applies the same rule when --instance-type overrides this one.
    volume_key = {} if has_instance_storage(instance_type) else {"VolumeKmsKeyId": kms_key_id}
    return {
        "SchemaVersion": "1.0",
        "SageMaker": {
            "PythonSDK": {
                "Modules": {
                    # sagemaker-core's _JobSettings evaluates Session.default_bucket() even when S3RootUri is set;
                    # without these keys it probes and creates the unmanaged bucket sagemaker-<region>-<account>.
                    "Session": {"DefaultS3Bucket": bucket_name, "DefaultS3ObjectKeyPrefix": REMOTE_JOBS_PREFIX},
                    "RemoteFunction": {
                        "RoleArn": role_arn,
                        "S3RootUri": f"s3://{bucket_name}/{REMOTE_JOBS_PREFIX}",
                        "S3KmsKeyId": kms_key_id,
                        **volume_key,
                        "VpcConfig": {"SecurityGroupIds": security_group_ids, "Subnets": subnets},
                        "Tags": [{"Key": key, "Value": value} for key, value in tags.items()],
                        "InstanceType": instance_type,
                        "ImageUri": image_uri,
                        "Dependencies": REMOTE_DEPENDENCIES,
                        "EnvironmentVariables": {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_TELEMETRY": "1"},
                        "IncludeLocalWorkDir": True,
                        "CustomFileFilter": {"IgnoreNamePatterns": REMOTE_IGNORED_NAMES},
                    }
                }
            }
        },
    }


def train_arguments(hyperparameters: HyperParameters) -> list[str]:
    """The train_sentiment.py flags for the settings' hyper-parameters and PyTorch 2 switches."""
    switches = {
        "torch-compile": hyperparameters.torch_compile,
        "bf16": hyperparameters.bf16,
        "fused-adamw": hyperparameters.fused_adamw,
    }
    return [
        "--epochs", str(hyperparameters.epochs),
        "--per-device-batch-size", str(hyperparameters.per_device_batch_size),
        "--learning-rate", str(hyperparameters.learning_rate),
        "--max-seq-length", str(hyperparameters.max_seq_length),
        "--seed", str(hyperparameters.seed),
        *(f"--{name}" if enabled else f"--no-{name}" for name, enabled in switches.items()),
    ]  # fmt: skip


class TrainingStack(EnvironmentStack):
    """Launch template for GPU training runs on EC2 and the ``@remote`` SDK config of one environment."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: EnvironmentSettings,
        foundation: FoundationStack,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            description=f"PyTorch platform GPU training ({settings.name}): EC2 launch template and @remote config",
            settings=settings,
            **kwargs,
        )
        self.foundation = foundation
        training = settings.training
        self.multi_node = training.efa or training.nodes > 1

        self.log_group = logs.LogGroup(
            self,
            "TrainingLogs",
            encryption_key=foundation.key,
            retention=log_retention(settings.logs.retention_days),
            removal_policy=self.removal_policy,
        )
        acknowledge_short_retention(self.log_group, settings.logs.retention_days, "logs.retention_days")
        # {folder on the instance: asset}; the instance unpacks each under the same path as in the repository.
        self.code = {folder: code_asset(self, construct_id) for construct_id, (folder, _) in CODE_ASSETS.items()}
        self.security_group = self._security_group()
        self.placement_group = (
            ec2.PlacementGroup(self, "ClusterPlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER)
            if self.multi_node
            else None
        )
        self.launch_template = self._launch_template()
        self.instance_policy = self._instance_policy()
        self.launcher_policy = self._launcher_policy()
        self.remote_config_parameter = self._remote_config_parameter()
        self._outputs()

    # --- network ------------------------------------------------------------------------------------------------

    def _security_group(self) -> ec2.SecurityGroup:
        group = ec2.SecurityGroup(
            self,
            "TrainingSecurityGroup",
            vpc=self.foundation.vpc,
            description="GPU training instances: no inbound from outside; HTTPS out (AWS APIs, DLC registry, PyPI, "
            "Hugging Face hub)",
            allow_all_outbound=False,
        )
        group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs, registries and the hub")
        if self.multi_node:
            # EFA requires a group that allows all traffic to and from itself (NCCL, libfabric, torchrun rendezvous).
            group.add_ingress_rule(group, ec2.Port.all_traffic(), "EFA/NCCL and rendezvous between nodes of a run")
            group.add_egress_rule(group, ec2.Port.all_traffic(), "EFA/NCCL and rendezvous between nodes of a run")
            acknowledge(
                group,
                "The only inbound rule admits this security group itself (the nodes of one run), as EFA requires; "
                "nothing outside the group can connect on any port.",
                "NIST.800.53.R5-EC2RestrictedCommonPorts",
            )
        return group

    # --- launch template ----------------------------------------------------------------------------------------

    def _launch_template(self) -> ec2.LaunchTemplate:
        training = self.settings.training
        template = ec2.LaunchTemplate(
            self,
            "TrainingLaunchTemplate",
            version_description=f"{training.instance_type} sentiment fine-tuning, DLC {training.image_tag}",
            instance_type=ec2.InstanceType(training.instance_type),
            # The newest DLAMI at each launch (NVIDIA driver, CUDA, EFA, Docker + NVIDIA container toolkit).
            machine_image=ec2.MachineImage.resolve_ssm_parameter_at_launch(
                training.dlami_ssm_parameter, os=ec2.OperatingSystemType.LINUX
            ),
            block_devices=[
                ec2.BlockDevice(
                    device_name="/dev/sda1",  # the Ubuntu DLAMI's root device
                    volume=ec2.BlockDeviceVolume.ebs(
                        training.root_volume_gib,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        encrypted=True,
                        kms_key=self.foundation.key,
                        delete_on_termination=True,
                        # The DLC image build and dataset sync are disk-bound minutes of a ~$30/h instance.
                        iops=6000,
                        throughput=500,
                    ),
                )
            ],
            require_imdsv2=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            # 1 hop (Control Tower CT.EC2.PR.2): only the host reaches IMDS and the instance role. The host does every
            # AWS call (ECR login, S3 sync and upload, and the Docker daemon's awslogs driver); the training
            # containers need no AWS credentials, and on the bridge network they cannot get them.
            http_put_response_hop_limit=1,
            instance_profile=self.foundation.training_instance_profile,
            detailed_monitoring=True,
            ebs_optimized=True,
            instance_initiated_shutdown_behavior=ec2.InstanceInitiatedShutdownBehavior.TERMINATE,
            placement_group=self.placement_group,
            user_data=self._user_data(),
        )
        # The network interfaces carry the subnet and group, so `run-instances` needs no network arguments.
        # Multi-node runs share one subnet (one AZ), as a cluster placement group requires.
        subnet_id = self.foundation.private_subnets.subnets[0].subnet_id
        cards = EFA_NETWORK_CARDS.get(training.instance_type.split(".")[0], 1) if training.efa else 1
        interfaces = [
            {
                "NetworkCardIndex": card,
                "DeviceIndex": 0 if card == 0 else 1,
                "SubnetId": subnet_id,
                "Groups": [self.security_group.security_group_id],
                "DeleteOnTermination": True,
                "AssociatePublicIpAddress": False,
                **({"InterfaceType": "efa"} if training.efa else {}),
            }
            for card in range(cards)
        ]
        cfn_template: ec2.CfnLaunchTemplate = template.node.default_child
        cfn_template.add_property_override("LaunchTemplateData.NetworkInterfaces", interfaces)
        return template

    def _user_data(self) -> ec2.UserData:
        """Fetch the code, run ec2_run.sh, ship the bootstrap log, power off (terminate) whatever happens."""
        training = self.settings.training
        code = {name: f"s3://{asset.s3_bucket_name}/{asset.s3_object_key}" for name, asset in self.code.items()}
        environment = {
            "AWS_REGION": self.region,
            "DLC_ACCOUNT": cdk.Stack.of(self).regional_fact(region_info.FactName.DLC_REPOSITORY_ACCOUNT),
            "REGISTRY_DOMAIN": self.url_suffix,
            "IMAGE_TAG": training.image_tag,
            "LOG_GROUP": self.log_group.log_group_name,
            "ARTIFACTS_BUCKET": self.foundation.artifacts_bucket.bucket_name,
            "OUTPUT_PREFIX": TRAINING_OUTPUT_PREFIX,
            "KMS_KEY_ID": self.foundation.key.key_arn,
            "DATASET": training.dataset,
            "BASE_MODEL": training.base_model,
            "EFA": "true" if training.efa else "false",
            "TRAIN_ARGS": " ".join(train_arguments(training.hyperparameters)),
            # The archive fits the Graviton endpoint: its dependencies vendored in code/lib, or installed at start-up.
            "PACKAGE_ARGS": "--vendor" if self.settings.graviton_endpoint.dependencies == "vendored" else "",
        }
        ship_logs = (
            f"python3 {WORK_DIR}/training_assets/instance/ship_logs.py --region {self.region} "
            f'--log-group {self.log_group.log_group_name} --log-stream "$(cat {WORK_DIR}/stream)" {BOOTSTRAP_LOG}'
        )
        user_data = ec2.UserData.for_linux()
        user_data.add_commands(
            "set -euo pipefail",
            f"exec > >(tee -a {BOOTSTRAP_LOG}) 2>&1",
            # Whatever happens from here on, the instance ships its log and powers off (and so terminates).
            f"shutdown -h +{training.max_run_hours * 60} 'training run exceeded max_run_hours'",
            f"trap '{ship_logs} || true; shutdown -h now' EXIT",
            f"mkdir -p {WORK_DIR} && cd {WORK_DIR}",
            "TOKEN=$(curl -sf -X PUT http://169.254.169.254/latest/api/token "
            "-H 'X-aws-ec2-metadata-token-ttl-seconds: 60')",
            "meta() { curl -sf -H \"X-aws-ec2-metadata-token: $TOKEN\" http://169.254.169.254/latest/meta-data/$1; }",
            f"echo \"$(meta reservation-id)/$(meta instance-id)/bootstrap\" > {WORK_DIR}/stream",
            *(f"export {name}={shlex.quote(value) if not cdk.Token.is_unresolved(value) else value}"
              for name, value in environment.items()),
            *(f"aws s3 cp --only-show-errors {uri} code.zip && python3 -m zipfile -e code.zip {folder} && rm code.zip"
              for folder, uri in code.items()),
            "bash training_assets/instance/ec2_run.sh",
        )  # fmt: skip
        return user_data

    # --- IAM ----------------------------------------------------------------------------------------------------

    def _instance_policy(self) -> iam.Policy:
        """What the training instances need of this stack's resources (attached to the foundation's role)."""
        group = f"arn:{self.partition}:logs:{self.region}:{self.account}:log-group:{self.log_group.log_group_name}"
        statements = [
            iam.PolicyStatement(
                sid="ReadTrainingCode",
                actions=["s3:GetObject"],
                resources=[asset.bucket.arn_for_objects(asset.s3_object_key) for asset in self.code.values()],
            ),
            iam.PolicyStatement(
                sid="WriteTrainingLogs",
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[group, f"{group}:log-stream:*"],
            ),
            iam.PolicyStatement(sid="FindTheNodesOfARun", actions=["ec2:DescribeInstances"], resources=["*"]),
        ]
        policy = iam.Policy(self, "TrainingInstancePolicy", statements=statements,
                            roles=[self.foundation.training_instance_role])  # fmt: skip
        acknowledge_wildcards(
            policy,
            (statements[1], "Each run writes new log streams, named after its reservation and instances, here."),
            (
                statements[2],
                "ec2:DescribeInstances has no resource-level permissions; nodes find peers by reservation.",
            ),
        )
        acknowledge(
            policy,
            "An iam.Policy in this stack, attached to the foundation's role, keeps grants on this stack's resources "
            "here without a dependency cycle; it is scoped to this stack's log group and code assets.",
            "NIST.800.53.R5-IAMNoInlinePolicy",
        )
        return policy

    def _launcher_policy(self) -> iam.ManagedPolicy:
        """Attach to whoever starts training runs: launch from this template, and nothing broader."""
        stack_arn = f"arn:{self.partition}:ec2:{self.region}:{self.account}"
        template_arn = f"{stack_arn}:launch-template/{self.launch_template.launch_template_id}"
        launched = [f"{stack_arn}:{kind}/*" for kind in ("instance", "volume", "network-interface")]
        from_template = {"ArnLike": {"ec2:LaunchTemplate": template_arn}}
        statements = [
            iam.PolicyStatement(sid="RunFromTheTrainingTemplate", actions=["ec2:RunInstances"],
                                resources=[template_arn, *launched], conditions=from_template),
            iam.PolicyStatement(
                sid="RunWithTheTemplatesResources",
                actions=["ec2:RunInstances"],
                resources=[
                    f"arn:{self.partition}:ec2:{self.region}::image/*",
                    f"{stack_arn}:subnet/{self.foundation.private_subnets.subnets[0].subnet_id}",
                    f"{stack_arn}:security-group/{self.security_group.security_group_id}",
                    *([f"{stack_arn}:placement-group/{self.placement_group.placement_group_name}"]
                      if self.placement_group else []),
                ],
            ),
            iam.PolicyStatement(sid="TagAtLaunch", actions=["ec2:CreateTags"], resources=launched,
                                conditions={"StringEquals": {"ec2:CreateAction": "RunInstances"}}),
            iam.PolicyStatement(sid="PassTheTrainingInstanceRole", actions=["iam:PassRole"],
                                resources=[self.foundation.training_instance_role.role_arn],
                                conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}),
            iam.PolicyStatement(
                sid="EncryptTheRootVolume",
                actions=["kms:CreateGrant", "kms:GenerateDataKeyWithoutPlaintext", "kms:Decrypt", "kms:DescribeKey"],
                resources=[self.foundation.key.key_arn],
                conditions={"StringEquals": {"kms:ViaService": f"ec2.{self.region}.{self.url_suffix}"}},
            ),
            iam.PolicyStatement(sid="ReadTheDlamiParameter", actions=["ssm:GetParameters"],
                                resources=[f"arn:{self.partition}:ssm:{self.region}::parameter/aws/service/*"]),
        ]  # fmt: skip
        policy = iam.ManagedPolicy(
            self,
            "TrainingLauncherPolicy",
            description=f"Start GPU training runs of {self.settings.name} from the training launch template",
            statements=statements,
        )
        reasons = {
            "RunFromTheTrainingTemplate": "RunInstances creates instances, volumes and interfaces with generated ids; "
            "the ec2:LaunchTemplate condition allows this template only.",
            "RunWithTheTemplatesResources": "The AMI is whichever DLAMI the public SSM parameter names at launch.",
            "TagAtLaunch": "Tags go on the instances, volumes and interfaces a launch creates (ec2:CreateAction).",
            "ReadTheDlamiParameter": "The AMI id comes from AWS's public DLAMI parameters under /aws/service/.",
        }
        acknowledge_wildcards(policy, *((s, reasons[s.sid]) for s in statements if s.sid in reasons))
        return policy

    # --- @remote ------------------------------------------------------------------------------------------------

    def _remote_config_parameter(self) -> ssm.StringParameter:
        """The SDK config as YAML in an SSM parameter; CloudFormation substitutes the deploy-time values."""
        foundation, training = self.foundation, self.settings.training
        subnets = foundation.private_subnets.subnets
        dlc_account = cdk.Stack.of(self).regional_fact(region_info.FactName.DLC_REPOSITORY_ACCOUNT)
        values = {
            "RoleArn": foundation.remote_job_role.role_arn,
            "RemoteJobsBucket": foundation.remote_jobs_bucket.bucket_name,
            "KeyArn": foundation.key.key_arn,
            "SecurityGroupId": foundation.workload_security_group.security_group_id,
            **{f"Subnet{i}": subnet.subnet_id for i, subnet in enumerate(subnets)},
            "DlcAccount": dlc_account,
        }
        config = remote_function_config(
            role_arn="${RoleArn}",
            bucket_name="${RemoteJobsBucket}",
            kms_key_id="${KeyArn}",
            security_group_ids=["${SecurityGroupId}"],
            subnets=[f"${{Subnet{i}}}" for i in range(len(subnets))],
            tags=self.settings.resource_tags,
            instance_type=training.remote_instance_type,
            image_uri=f"${{DlcAccount}}.dkr.ecr.${{AWS::Region}}.${{AWS::URLSuffix}}/pytorch-training:"
            f"{training.remote_image_tag}",
        )
        return ssm.StringParameter(
            self,
            "RemoteFunctionConfig",
            parameter_name=f"/{self.settings.tags.project}/{self.settings.name}/sagemaker/remote-function-config",
            description="SageMaker Python SDK config.yaml for @remote training jobs of this environment",
            string_value=cdk.Fn.sub(yaml.safe_dump(config, sort_keys=False), values),
        )

    # --- outputs ------------------------------------------------------------------------------------------------

    def _outputs(self) -> None:
        training = self.settings.training
        template = (
            f"LaunchTemplateId={self.launch_template.launch_template_id},"
            f"Version={self.launch_template.latest_version_number}"
        )
        run = f"aws ec2 run-instances --region {self.region} --launch-template {template}"
        cdk.CfnOutput(
            self,
            "LaunchTemplateId",
            value=self.launch_template.launch_template_id,
            description="Launch template of GPU training runs",
        )
        cdk.CfnOutput(
            self,
            "RunSingleNodeTrainingCommand",
            value=f"{run} --count 1",
            description=f"Starts one {training.instance_type} training run; it uploads model.tar.gz and "
            f"metrics.json to the artifacts bucket under {TRAINING_OUTPUT_PREFIX}<reservation id>/ and "
            "powers off",
        )
        if self.multi_node:
            nodes = max(training.nodes, 2)
            cdk.CfnOutput(
                self,
                "RunMultiNodeTrainingCommand",
                value=f"{run} --count {nodes}",
                description=f"Starts a {nodes}-node training run (EFA: {training.efa})",
            )
        cdk.CfnOutput(
            self,
            "TrainingLogGroupName",
            value=self.log_group.log_group_name,
            description="CloudWatch Logs of the training runs",
        )
        cdk.CfnOutput(
            self,
            "TrainingLauncherPolicyArn",
            value=self.launcher_policy.managed_policy_arn,
            description="Attach to the people or pipelines that start training runs",
        )
        cdk.CfnOutput(
            self,
            "FetchRemoteFunctionConfigCommand",
            value=f"aws ssm get-parameter --region {self.region} --name {self.remote_config_parameter.parameter_name} "
            "--query Parameter.Value --output text > config.yaml",
            description="Writes the @remote config.yaml; then export SAGEMAKER_USER_CONFIG_OVERRIDE=$PWD/config.yaml",
        )  # fmt: skip
