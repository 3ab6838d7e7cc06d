"""The foundation every other stack builds on: the platform KMS key, buckets, network and least-privilege roles.

The stack maps one environment's settings onto constructs (stacks/components/) and exports what the other stacks
use. Its resources were once built here directly: ``_keep_deployed_logical_ids`` holds each moved resource to the
logical id it was deployed with (stacks/components/logical_ids.py), so no deployed resource is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct, IConstruct

from platform_facts.instances import has_local_nvme
from stacks.compliance import acknowledge_short_retention, log_retention
from stacks.components.image_builds import ImageRegistry
from stacks.components.logical_ids import keep_logical_ids
from stacks.components.platform_key import PlatformKey
from stacks.components.platform_network import PlatformNetwork, WorkloadSecurityGroup, hold_to_the_vpc
from stacks.components.provider_log_groups import expire_provider_logs
from stacks.components.remote_job_launcher import RemoteJobLauncherPolicy, RemoteJobsSecurityGroup, TrainingJobLimits
from stacks.components.sagemaker_endpoint import ModelNetwork, endpoint_name_for
from stacks.components.sagemaker_roles import EndpointExecutionRole, RemoteJobRole, VpcAttachment
from stacks.components.secure_buckets import KEEP_LOGICAL_IDS, SecureBuckets
from stacks.components.training_instance_role import TrainingInstanceRole
from stacks.components.training_job_log_retention import TrainingJobLogRetention
from stacks.environment_stack import EnvironmentStack
from stacks.settings import ENDPOINT_MODELS_PREFIX, EnvironmentSettings, sagemaker_gpu_training_types

TRAINING_OUTPUT_PREFIX = "training-output/"
DATA_CAPTURE_PREFIX = "data-capture/"
# The one log group SageMaker writes every training job's streams to (<job name>/algo-<n>-<timestamp>).
TRAINING_JOB_LOG_GROUP = "/aws/sagemaker/TrainingJobs"


def remote_config_parameter_name(settings: EnvironmentSettings, caller: str) -> str:
    """The SSM parameter holding ``caller``'s @remote config.yaml in the environment (written by the TrainingStack,
    read by the holders of that caller's launcher policy)."""
    return f"/{settings.tags.project}/{settings.name}/sagemaker/remote-function-config/{caller}"


def caller_construct_suffix(caller: str) -> str:
    """The part of a caller's construct ids after the construct's kind: ``nlp`` -> ``Nlp`` (caller names are lowercase
    letters and digits, so two callers never share it)."""
    return caller.capitalize()


@dataclass(frozen=True)
class RemoteCaller:
    """What one @remote caller (a user or team of training.remote_callers) has of its own."""

    name: str
    job_role: iam.IRole
    launcher_policy: iam.ManagedPolicy
    security_group: ec2.SecurityGroup


class FoundationStack(EnvironmentStack):
    """KMS key, S3 buckets, VPC and the IAM roles of one environment."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: EnvironmentSettings,
        image_registry: ImageRegistry | None = None,
        **kwargs: Any,
    ) -> None:
        """``image_registry``: the account whose repositories hold the platform's built images (the pipeline's), which
        the ECR endpoint's policy admits; None: this account's own."""
        super().__init__(
            scope,
            construct_id,
            description=f"PyTorch platform foundation ({settings.name}): KMS key, buckets, network, IAM roles",
            settings=settings,
            **kwargs,
        )
        self.image_registry = image_registry
        self.key = PlatformKey(
            self,
            "PlatformKey",
            alias=f"alias/{settings.tags.project}-{settings.name}",
            description=f"Encrypts the {settings.name} PyTorch platform's data at rest",
            removal_policy=self.removal_policy,
            pending_window_days=7 if settings.destroy_on_delete else 30,
        )
        self._buckets()
        self._network()
        self._roles()
        self._network_perimeter()
        if settings.logs.manage_training_job_log_group:
            self.training_job_log_retention = TrainingJobLogRetention(
                self,
                "TrainingJobLogRetention",
                log_group_name=TRAINING_JOB_LOG_GROUP,
                retention=log_retention(settings.logs.retention_days),
            )
        # CDK's provider handlers (bucket emptying, default security group) log to groups that expire.
        expire_provider_logs(self, key=self.key, retention_days=settings.logs.retention_days,
                             removal_policy=self.removal_policy, retention_setting="logs.retention_days")  # fmt: skip
        self._keep_deployed_logical_ids()
        self._outputs()

    @property
    def availability_zones(self) -> list[str]:
        """The region's first zones as deploy-time tokens: no account lookup at synth and no hard-coded zone names
        (an environment-agnostic stack would otherwise get only two zones)."""
        return [cdk.Fn.select(i, cdk.Fn.get_azs()) for i in range(self.settings.vpc.max_azs)]

    def _buckets(self) -> None:
        retain = not self.settings.destroy_on_delete
        self.buckets = buckets = SecureBuckets(
            self,
            KEEP_LOGICAL_IDS,
            key=self.key,
            removal_policy=self.removal_policy,
            access_log_expiration_days=365 if retain else 90,
            noncurrent_version_days=90 if retain else 30,
            no_replication_reason="The platform is single-region by design; versioning plus the retain policy of "
            "staging and prod protect the data, and datasets and models can be rebuilt from their sources.",
            control_tower=True,
            no_object_lock_reason="No S3 Object Lock (CT.S3.PR.9): versioning keeps overwritten and deleted objects, "
            "lifecycle rules must expire noncurrent versions and logs, and dev is emptied on destroy; a WORM lock "
            "would block all three.",
        )
        self.access_logs_bucket = buckets.access_logs
        self.datasets_bucket = buckets.add_data_bucket("Datasets")
        self.artifacts_bucket = buckets.add_data_bucket("Artifacts")
        self.remote_jobs_bucket = buckets.add_data_bucket("RemoteJobs")

    def _network(self) -> None:
        """A new VPC from the settings, or the existing one they name (explicit ids, no lookup: synth stays offline;
        an imported VPC brings its own endpoints and flow logs); the workloads' and the @remote jobs' security groups in
        either."""
        vpc_settings = self.settings.vpc
        self.network: PlatformNetwork | None = None
        if vpc_settings.vpc_id is not None:
            self.vpc: ec2.IVpc = ec2.Vpc.from_vpc_attributes(
                self,
                "Vpc",
                vpc_id=vpc_settings.vpc_id,
                availability_zones=vpc_settings.availability_zones,
                private_subnet_ids=vpc_settings.private_subnet_ids,
            )
            self.private_subnets = ec2.SubnetSelection(subnets=self.vpc.private_subnets)
        else:
            self.network = PlatformNetwork(
                self,
                "Vpc",
                cidr=vpc_settings.cidr,
                max_azs=vpc_settings.max_azs,
                nat_gateways=vpc_settings.nat_gateways,
                subnet_masks=(vpc_settings.PRIVATE_SUBNET_MASK, vpc_settings.PUBLIC_SUBNET_MASK),
                flow_log_key=self.key,
                flow_log_retention=log_retention(vpc_settings.flow_log_retention_days),
                removal_policy=self.removal_policy,
                image_registry_accounts=self._image_registry_accounts(),
            )
            acknowledge_short_retention(
                self.network.flow_log_group, vpc_settings.flow_log_retention_days, "vpc.flow_log_retention_days"
            )
            self.vpc, self.private_subnets = self.network.vpc, self.network.private_subnets
        self.workload_security_group = WorkloadSecurityGroup(self, "WorkloadSecurityGroup", vpc=self.vpc)
        # Each caller's @remote jobs run in a group of their own, whose members (that caller's instances) admit each
        # other: torchrun's rendezvous and NCCL authenticate nobody, so callers do not share one.
        self.remote_jobs_security_groups = {
            caller: RemoteJobsSecurityGroup(
                self, f"RemoteJobsSecurityGroup{caller_construct_suffix(caller)}", vpc=self.vpc, caller=caller
            )
            for caller in self.settings.training.remote_callers
        }

    def _network_perimeter(self) -> None:
        """The roles whose code runs in the platform's VPC (the GPU training instances, each caller's @remote jobs)
        reach the buckets and the key only from there: their credentials, if taken, work nowhere else. Not held:
        people and the pipeline (outside the VPC by design, with their own scoped policies), and the endpoints'
        execution role, with which SageMaker itself downloads model archives and uploads captured data, on a network
        path AWS does not document for data capture (docs/security.md, "Not enforced yet")."""
        for role in [self.training_instance_role, *(caller.job_role for caller in self.remote_callers.values())]:
            hold_to_the_vpc(role)
        self.buckets.hold_to_network(self.vpc.vpc_id)
        self.key.hold_to_network(self.vpc.vpc_id)

    def _image_registry_accounts(self) -> list[str]:
        """The accounts whose repositories hold the images the workloads pull that the platform built."""
        accounts = [self.settings.training.image_registry_account]
        accounts.append(self.image_registry.account if self.image_registry else None)
        return [account for account in accounts if account is not None]

    def _roles(self) -> None:
        """One role per principal: the endpoints, the GPU training instances, @remote jobs and their launchers."""
        network = VpcAttachment(
            vpc=self.vpc, subnets=self.private_subnets.subnets or [], security_group=self.workload_security_group
        )
        self.endpoint_execution = EndpointExecutionRole(
            self,
            "EndpointExecutionRole",
            artifacts=self.artifacts_bucket,
            model_prefixes=[ENDPOINT_MODELS_PREFIX, self.settings.multi_model_endpoint.models_prefix],
            data_capture_prefix=DATA_CAPTURE_PREFIX,
            key=self.key,
            network=network,
            # The environment's endpoints are named after their stacks (endpoint_name_for), which share the stage's
            # prefix with this one: dev-Foundation, dev-GravitonEndpoint, dev-MultiModelEndpoint.
            endpoint_name_prefix=endpoint_name_for(self).removesuffix(self.node.id),
        )
        self.endpoint_role = self.endpoint_execution.role
        self.training_instance = TrainingInstanceRole(
            self,
            "TrainingInstanceRole",
            datasets=self.datasets_bucket,
            artifacts=self.artifacts_bucket,
            training_output_prefix=TRAINING_OUTPUT_PREFIX,
            training_repository=self.settings.training.image.repository,  # the image table's entry of image_tag
            key=self.key,
        )
        self.training_instance_role = self.training_instance.role
        self.training_instance_profile = self.training_instance.instance_profile
        self.remote_callers: dict[str, RemoteCaller] = {}
        for caller in self.settings.training.remote_callers:
            self.remote_callers[caller] = self._remote_caller(caller, network)

    def _remote_caller(self, caller: str, network: VpcAttachment) -> RemoteCaller:
        """One caller's job role and launcher policy (training_assets/remote_jobs.py): the shared role every job once
        ran as is gone on purpose, since a job could then write every other caller's results."""
        suffix = caller_construct_suffix(caller)
        own_network = replace(network, security_group=self.remote_jobs_security_groups[caller])
        job_role = RemoteJobRole(
            self,
            f"RemoteJobRole{suffix}",
            caller=caller,
            remote_jobs=self.remote_jobs_bucket,
            datasets=self.datasets_bucket,
            training_job_log_group=TRAINING_JOB_LOG_GROUP,
            training_repository=self.settings.training.remote_image.repository,  # ... of remote_image_tag
            key=self.key,
            network=own_network,
        ).role
        launcher = RemoteJobLauncherPolicy(
            self,
            f"RemoteJobLauncherPolicy{suffix}",
            caller=caller,
            job_role=job_role,
            remote_jobs=self.remote_jobs_bucket,
            key=self.key,
            training_job_log_group=TRAINING_JOB_LOG_GROUP,
            config_parameter_name=remote_config_parameter_name(self.settings, caller),
            allowed_tag_keys=list(self.settings.resource_tags),
            network=own_network,
            limits=TrainingJobLimits(
                instance_types=(types := sagemaker_gpu_training_types()),
                nvme_instance_types=[name for name in types if has_local_nvme(name)],
                max_runtime_seconds=self.settings.training.max_run_hours * 3600,
            ),
        )
        return RemoteCaller(caller, job_role, launcher.policy, self.remote_jobs_security_groups[caller])

    def model_network(self, *, isolated: bool) -> ModelNetwork:
        """Where the endpoints' model containers run: the private subnets and the workload security group."""
        return ModelNetwork(
            subnet_ids=[subnet.subnet_id for subnet in self.private_subnets.subnets or []],
            security_group_ids=[self.workload_security_group.security_group_id],
            isolated=isolated,
        )

    def _keep_deployed_logical_ids(self) -> None:
        """The resources this stack once built as its direct children keep the logical ids they were deployed with
        (a construct's main resource, its child ``Default``, keeps its id without this)."""
        moved: dict[str, IConstruct] = {
            "EndpointExecutionRolePolicy": self.endpoint_execution.policy,
            "TrainingInstancePolicy": self.training_instance.policy,
            "TrainingInstanceProfile": self.training_instance.instance_profile,
        }
        if self.network is not None:
            moved |= {
                "FlowLogs": self.network.flow_log_group,
                "FlowLogRole": self.network.flow_log_role,
                "VpcEndpointSecurityGroup": self.network.endpoint_security_group,
            }
        if self.settings.logs.manage_training_job_log_group:
            moved |= {
                "TrainingJobLogRetentionRole": self.training_job_log_retention.role,
                "TrainingJobLogRetentionPolicy": self.training_job_log_retention.policy,
            }
        for deployed_id, construct in moved.items():
            keep_logical_ids(construct, deployed_id)

    def _outputs(self) -> None:
        values = {
            "PlatformKeyArn": (self.key.key_arn, "KMS key encrypting the platform's data at rest"),
            "DatasetsBucketName": (self.datasets_bucket.bucket_name, "Training datasets"),
            "ArtifactsBucketName": (self.artifacts_bucket.bucket_name, "Training output and endpoint model archives"),
            "RemoteJobsBucketName": (self.remote_jobs_bucket.bucket_name, "S3RootUri of @remote jobs"),
            "AccessLogsBucketName": (self.access_logs_bucket.bucket_name, "S3 server access logs"),
            "EndpointExecutionRoleArn": (self.endpoint_role.role_arn, "SageMaker execution role of the endpoints"),
            "TrainingInstanceProfileArn": (self.training_instance_profile.instance_profile_arn, "GPU instance profile"),
            **{
                f"RemoteJobLauncherPolicyArn{caller_construct_suffix(name)}": (
                    caller.launcher_policy.managed_policy_arn,
                    f"Attach to the people of {name} who run @remote jobs (and to nobody else)",
                )
                for name, caller in self.remote_callers.items()
            },
            "PrivateSubnetIds": (
                cdk.Fn.join(",", [s.subnet_id for s in self.private_subnets.subnets or []]),
                "Private subnets",
            ),
            "WorkloadSecurityGroupId": (
                self.workload_security_group.security_group_id,
                "Security group of SageMaker workloads",
            ),
        }
        for name, (value, description) in values.items():
            cdk.CfnOutput(self, name, value=value, description=description)
