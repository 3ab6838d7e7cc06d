"""GPU training: the p4d launch template that runs one training job and powers off, and the
SageMaker SDK ``config.yaml`` that sends ``@remote`` functions to this environment's training jobs.

Nothing here launches an instance: a run starts through the platform's launcher (``TrainingLauncher``), whose
``aws lambda invoke`` command the stack outputs; nobody else may call RunInstances with the template.
"""

from __future__ import annotations

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

from platform_facts.instances import has_local_nvme, instance_type
from stacks.compliance import acknowledge, acknowledge_short_retention, acknowledge_wildcards, log_retention
from stacks.components.image_builds import BuiltImage, ImageRegistry
from stacks.components.training_launch_template import (
    KEEP_LOGICAL_IDS,
    CapacityTarget,
    TrainingLaunchTemplate,
    TrainingRun,
)
from stacks.components.training_launcher import TrainingLauncher
from stacks.components.training_run_reaper import TrainingRunReaper
from stacks.environment_stack import EnvironmentStack
from stacks.foundation import (
    TRAINING_OUTPUT_PREFIX,
    FoundationStack,
    caller_construct_suffix,
    remote_config_parameter_name,
)
from stacks.settings import EnvironmentSettings, HyperParameters, TrainingSettings
from training_assets.remote_jobs import OWNER_TAG_KEY, caller_prefix

ROOT = Path(__file__).resolve().parents[1]
# The image the promotion pipeline builds from training_assets/image/Dockerfile (stacks/pipeline.py) and the EC2 nodes
# pull by digest when training.image_registry_account names the pipeline's account.
TRAINING_IMAGE = "training"
# Where the data scientist's copy of the SDK config points for the job's dependencies (relative to the repo root).
REMOTE_DEPENDENCIES = "training_assets/requirements-remote.txt"
# Names the SDK must not upload when IncludeLocalWorkDir packs the working directory.
REMOTE_IGNORED_NAMES = [
    ".venv*",
    "node_modules",
    "cdk.out",
    ".git",
    "__pycache__",
    "tests",
    "proving_ground",
    "*.tar.gz",
]
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
    caller: str,
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
    volume_key = {} if has_local_nvme(instance_type) else {"VolumeKmsKeyId": kms_key_id}
    return {
        "SchemaVersion": "1.0",
        "SageMaker": {
            "PythonSDK": {
                "Modules": {
                    # sagemaker-core's _JobSettings evaluates Session.default_bucket() even when S3RootUri is set;
                    # without these keys it probes and creates the unmanaged bucket sagemaker-<region>-<account>.
                    "Session": {"DefaultS3Bucket": bucket_name, "DefaultS3ObjectKeyPrefix": caller_prefix(caller)},
                    "RemoteFunction": {
                        # The caller's own role and prefix (training_assets/remote_jobs.py): the launcher policy of
                        # the caller passes no other role and stages nowhere else.
                        "RoleArn": role_arn,
                        "S3RootUri": f"s3://{bucket_name}/{caller_prefix(caller)}",
                        "S3KmsKeyId": kms_key_id,
                        **volume_key,
                        "VpcConfig": {"SecurityGroupIds": security_group_ids, "Subnets": subnets},
                        # The launcher policy requires it (sagemaker:InterContainerTrafficEncryption).
                        "EnableInterContainerTrafficEncryption": True,
                        "Tags": [
                            *({"Key": key, "Value": value} for key, value in tags.items()),
                            {"Key": OWNER_TAG_KEY, "Value": caller},
                        ],
                        "InstanceType": instance_type,
                        "ImageUri": image_uri,
                        "Dependencies": REMOTE_DEPENDENCIES,
                        "EnvironmentVariables": {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_TELEMETRY": "1"},
                        "IncludeLocalWorkDir": True,
                        "CustomFileFilter": {"IgnoreNamePatterns": REMOTE_IGNORED_NAMES},
                    },
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


def run_arguments(training: TrainingSettings) -> list[str]:
    """The train_sentiment.py flags of a multi-node-safe run: the global batch fixed whatever the node count (default:
    what one node takes), checkpoints, and the collective timeout."""
    gpu = instance_type(training.instance_type).gpu
    per_node = training.hyperparameters.per_device_batch_size * (gpu.count if gpu else 1)
    return [
        "--global-batch-size", str(training.hyperparameters.global_batch_size or per_node),
        "--checkpoint-steps", str(training.checkpoint_steps),
        "--collective-timeout", str(training.collective_timeout_seconds),
    ]  # fmt: skip


def launch_command(region: str, function_name: str, nodes: int) -> str:
    """The AWS CLI command that asks the launcher for a run of ``nodes`` instances (RUN_NAME: the run's id)."""
    payload = f'{{"run_name": "RUN_NAME", "nodes": {nodes}}}'
    return (
        f"aws lambda invoke --region {region} --function-name {function_name} "
        f"--cli-binary-format raw-in-base64-out --payload '{payload}' /dev/stdout"
    )


class TrainingStack(EnvironmentStack):
    """Launch template for GPU training runs on EC2 and the ``@remote`` SDK config of one environment."""

    # Long: the stack composes its constructs in dependency order (code assets, launch template, run reaper, policies,
    # @remote config, outputs), each a call with its settings.
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
        self.training_image = self._training_image()
        self.training_template = TrainingLaunchTemplate(
            self,
            KEEP_LOGICAL_IDS,
            vpc=foundation.vpc,
            subnet=self._training_subnet(),
            instance_type=training.instance_type,
            image_ssm_parameter=training.dlami_ssm_parameter,
            instance_role=foundation.training_instance_role,
            instance_profile=foundation.training_instance_profile,
            key=foundation.key,
            run=self._training_run(),
            root_volume_gib=training.root_volume_gib,
            efa=training.efa,
            nodes=training.nodes,
            capacity=CapacityTarget.of(
                training.capacity_reservation_id,
                training.capacity_reservation_resource_group_arn,
                capacity_block=training.market_type == "capacity-block",
            ),
            version_description=f"{training.instance_type} sentiment fine-tuning, DLC {training.image.image}",
        )
        self.security_group = self.training_template.security_group
        self.placement_group = self.training_template.placement_group
        self.launch_template = self.training_template.launch_template
        # The outside bound of a run's lifetime (the user data's own shutdown can be overridden at launch).
        TrainingRunReaper(
            self,
            "TrainingRunReaper",
            launch_template_id=self.training_template.launch_template_id,
            max_run_hours=training.max_run_hours,
            key=foundation.key,
            log_retention_days=settings.logs.retention_days,
            removal_policy=self.removal_policy,
            retention_setting="logs.retention_days",
        )
        # The only principal that calls RunInstances with the template; people invoke it (the launcher policy).
        self.launcher = TrainingLauncher(self, "TrainingLauncher", template=self.training_template,
                                         max_nodes=max(training.nodes, 2) if self.multi_node else 1,
                                         instances=foundation.training_instance, key=foundation.key,
                                         log_retention_days=settings.logs.retention_days,
                                         removal_policy=self.removal_policy,
                                         retention_setting="logs.retention_days")  # fmt: skip
        self._instance_policy()
        self.launcher_policy = self._launcher_policy()
        self.remote_config_parameters = {
            caller: self._remote_config_parameter(caller) for caller in self.foundation.remote_callers
        }
        self._outputs()

    # --- launch template inputs ---------------------------------------------------------------------------------

    def _training_subnet(self) -> ec2.ISubnet:
        """The private subnet the runs start in (training.subnet_index: a zone that offers the instance type);
        multi-node runs share it, as a cluster placement group needs one zone. Settings checked that it exists."""
        subnets = self.foundation.private_subnets.subnets or []
        return subnets[self.settings.training.subnet_index]

    def _training_image(self) -> BuiltImage | None:
        """The pipeline-built training image when training.image_registry_account names the pipeline's account; the
        instance role may pull it. None: each node builds its image (ec2_run.sh says so in its log)."""
        account = self.settings.training.image_registry_account
        if account is None:
            return None
        image = BuiltImage(self, "TrainingImage", project=self.settings.tags.project, image=TRAINING_IMAGE,
                           registry=ImageRegistry(account, self.region))  # fmt: skip
        # Imported as mutable, the foundation's role takes the grant in a policy of this stack (no cross-stack edit).
        role = iam.Role.from_role_name(self, "InstanceRoleForImagePulls",
                                       self.foundation.training_instance_role.role_name, mutable=True)  # fmt: skip
        image.grant_pull(role)
        policy = role.node.find_child("Policy")
        login = iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"])
        acknowledge_wildcards(policy, (login, "ecr:GetAuthorizationToken has no resource-level permissions; the pull "
                                       "itself is scoped to the training image's repository."))  # fmt: skip
        acknowledge(
            policy,
            "An iam.Policy in this stack, attached to the foundation's role, keeps the image grant here without a "
            "dependency cycle; it is scoped to the training image's repository.",
            "NIST.800.53.R5-IAMNoInlinePolicy",
        )
        return image

    def _training_run(self) -> TrainingRun:
        """What the instance runs: fetch the code, run ec2_run.sh with this environment's settings."""
        training = self.settings.training
        code = {name: f"s3://{asset.s3_bucket_name}/{asset.s3_object_key}" for name, asset in self.code.items()}
        environment = {
            "AWS_REGION": self.region,
            "DLC_ACCOUNT": cdk.Stack.of(self).regional_fact(region_info.FactName.DLC_REPOSITORY_ACCOUNT),
            "REGISTRY_DOMAIN": self.url_suffix,
            "DLC_REPOSITORY": training.image.repository,
            "IMAGE_TAG": training.image_tag,
            "LOG_GROUP": self.log_group.log_group_name,
            "ARTIFACTS_BUCKET": self.foundation.artifacts_bucket.bucket_name,
            "OUTPUT_PREFIX": TRAINING_OUTPUT_PREFIX,
            "KMS_KEY_ID": self.foundation.key.key_arn,
            "INSTANCE_ROLE_ID": self.foundation.training_instance_role.role_id,
            "DATASET": training.dataset,
            "BASE_MODEL": training.base_model,
            "EFA": "true" if training.efa else "false",
            "TRAIN_ARGS": " ".join([*train_arguments(training.hyperparameters), *run_arguments(training)]),
            # The pipeline's image by digest, resolved when the stack deploys: every node of a run pulls the same one.
            "TRAINING_IMAGE_URI": self.training_image.image_uri if self.training_image else "",
            "LOCAL_NVME": "true" if has_local_nvme(training.instance_type) else "false",
            "RENDEZVOUS_TIMEOUT": str(training.rendezvous_timeout_seconds),
            "MAX_RESTARTS": str(training.max_restarts),
        }
        return TrainingRun(code=code, environment=environment, run_command="bash training_assets/instance/ec2_run.sh",
                           ship_logs_script="training_assets/instance/ship_logs.py",
                           log_group_name=self.log_group.log_group_name,
                           max_run_hours=training.max_run_hours)  # fmt: skip

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
        """Attach to whoever starts training runs: invoke the launcher, nothing else (its logical id kept)."""
        policy = iam.ManagedPolicy(self, "TrainingLauncherPolicy", description=f"Start GPU training runs of "
                                   f"{self.settings.name} through the platform's training launcher")  # fmt: skip
        self.launcher.grant_invoke(policy)
        return policy

    # --- @remote ------------------------------------------------------------------------------------------------

    def _remote_config_parameter(self, caller: str) -> ssm.StringParameter:
        """``caller``'s SDK config as YAML in an SSM parameter; CloudFormation substitutes the deploy-time values."""
        foundation, training = self.foundation, self.settings.training
        own = foundation.remote_callers[caller]
        subnets = foundation.private_subnets.subnets or []
        dlc_account = cdk.Stack.of(self).regional_fact(region_info.FactName.DLC_REPOSITORY_ACCOUNT)
        values = {
            "RoleArn": own.job_role.role_arn,
            "RemoteJobsBucket": foundation.remote_jobs_bucket.bucket_name,
            "KeyArn": foundation.key.key_arn,
            # The caller's own group (stacks/components/remote_job_launcher.py): a job's instances reach each other.
            "SecurityGroupId": own.security_group.security_group_id,
            **{f"Subnet{i}": subnet.subnet_id for i, subnet in enumerate(subnets)},
            "DlcAccount": dlc_account,
        }
        config = remote_function_config(
            caller=caller,
            role_arn="${RoleArn}",
            bucket_name="${RemoteJobsBucket}",
            kms_key_id="${KeyArn}",
            security_group_ids=["${SecurityGroupId}"],
            subnets=[f"${{Subnet{i}}}" for i in range(len(subnets))],
            tags=self.settings.resource_tags,
            instance_type=training.remote_instance_type,
            # repository:tag of the image table's entry for remote_image_tag (the table names the repository).
            image_uri=f"${{DlcAccount}}.dkr.ecr.${{AWS::Region}}.${{AWS::URLSuffix}}/{training.remote_image.image}",
        )
        return ssm.StringParameter(
            self,
            f"RemoteFunctionConfig{caller_construct_suffix(caller)}",
            parameter_name=remote_config_parameter_name(self.settings, caller),
            description=f"SageMaker Python SDK config.yaml for the @remote training jobs of {caller}",
            string_value=cdk.Fn.sub(yaml.safe_dump(config, sort_keys=False), values),
        )

    # --- outputs ------------------------------------------------------------------------------------------------

    def _run_outputs(self) -> None:
        """Where and how training runs start: the template, its zone and the commands."""
        training = self.settings.training
        cdk.CfnOutput(
            self,
            "LaunchTemplateId",
            value=self.training_template.launch_template_id,
            description="Launch template of GPU training runs",
        )
        subnet = self.training_template.subnet
        # The zone only: the subnet id is an import from the Foundation (cfn-lint W6001 refuses re-exporting imports);
        # it is entry training.subnet_index of the Foundation's PrivateSubnetIds output.
        cdk.CfnOutput(
            self,
            "TrainingAvailabilityZone",
            value=subnet.availability_zone,
            description=f"Zone of the training subnet (entry {training.subnet_index} of the Foundation's "
            f"PrivateSubnetIds, training.subnet_index) where runs start; CheckTrainingCapacityCommand checks that it "
            f"offers {training.instance_type}",
        )
        cdk.CfnOutput(
            self,
            "CheckTrainingCapacityCommand",
            value=f"aws ec2 describe-instance-type-offerings --region {self.region} --location-type availability-zone "
            f"--filters Name=instance-type,Values={training.instance_type} "
            f"Name=location,Values={subnet.availability_zone} --query 'InstanceTypeOfferings[].Location' --output text",
            description=f"Prints the training subnet's zone if it offers {training.instance_type}, nothing if not "
            "(then pick another training.subnet_index)",
        )
        cdk.CfnOutput(
            self,
            "RunSingleNodeTrainingCommand",
            value=launch_command(self.region, self.launcher.function.function_name, 1),
            description=f"Asks the launcher for one {training.instance_type} training run named RUN_NAME (replace it) "
            "in the training subnet's zone (TrainingAvailabilityZone); it uploads model.tar.gz, its SHA-256 and "
            f"metrics.json to the artifacts bucket under {TRAINING_OUTPUT_PREFIX}<run name>/ and powers off",
        )
        if self.multi_node:
            nodes = max(training.nodes, 2)
            cdk.CfnOutput(
                self,
                "RunMultiNodeTrainingCommand",
                value=launch_command(self.region, self.launcher.function.function_name, nodes),
                description=f"Starts a {nodes}-node training run (EFA: {training.efa})",
            )

    def _outputs(self) -> None:
        self._run_outputs()
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
            description="Attach to the people or pipelines that start training runs (invoke the launcher only)",
        )
        for caller, parameter in self.remote_config_parameters.items():
            cdk.CfnOutput(
                self,
                f"FetchRemoteFunctionConfigCommand{caller_construct_suffix(caller)}",
                value=f"aws ssm get-parameter --region {self.region} --name {parameter.parameter_name} "
                "--query Parameter.Value --output text > config.yaml",
                description=f"Writes the @remote config.yaml of {caller} (their launcher policy reads it); then export "
                "SAGEMAKER_USER_CONFIG_OVERRIDE=$PWD/config.yaml",
            )  # fmt: skip
