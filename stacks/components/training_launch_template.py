"""The GPU training launch template: security group, cluster placement group (multi-node runs), the launch template
whose user data runs one training job and powers off, and ``grant_launch`` with RunInstances scoped to it.

Nothing here launches an instance: runs start through the platform's launcher (training_launcher.py), the one
holder of ``grant_launch``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from platform_facts.instances import instance_type as instance_facts
from stacks.compliance import acknowledge, acknowledge_control, acknowledge_wildcards

# Give a stack's one TrainingLaunchTemplate this id: CDK leaves "Default" out of logical ids, so the security group
# and launch template keep the ids they had as direct children of the TrainingStack (no replacement on deploy).
KEEP_LOGICAL_IDS = "Default"


@dataclass(frozen=True)
class TrainingRun:
    """What the user data runs: download and unpack ``code``, export ``environment``, run ``run_command``; whatever
    happens, ship the bootstrap log to ``log_group_name`` and power off (the instance terminates)."""

    code: Mapping[str, str]  # folder -> s3:// URI of a zip archive, unpacked into <work_dir>/<folder>
    environment: Mapping[str, str]  # exported before the run (tokens allowed)
    run_command: str  # run from <work_dir>, e.g. "bash training_assets/ec2_run.sh"
    ship_logs_script: str  # python script under <work_dir> that ships the bootstrap log to CloudWatch Logs
    log_group_name: str
    max_run_hours: int
    work_dir: str = "/opt/sentiment-training"
    bootstrap_log: str = "/var/log/sentiment-training.log"


# The instances' IMDS hop limit; the launch grant requires it (ec2:MetadataHttpPutResponseHopLimit).
METADATA_HOP_LIMIT = 1


@dataclass(frozen=True)
class CapacityTarget:
    """Capacity bought ahead that runs launch into: one reservation by id (an On-Demand Capacity Reservation, or a
    Capacity Block for ML with ``capacity_block``), or any matching reservation of a resource group (EC2 user guide,
    "Launch instances into an existing Capacity Reservation", "Capacity Blocks for ML": a Capacity Block is targeted
    by its id with the market type capacity-block)."""

    reservation_id: str | None = None
    resource_group_arn: str | None = None
    capacity_block: bool = False

    def __post_init__(self) -> None:
        if (self.reservation_id is None) == (self.resource_group_arn is None):
            raise ValueError("a capacity target names either a reservation id or a resource group ARN")
        if self.capacity_block and self.reservation_id is None:
            raise ValueError("a Capacity Block is targeted by its reservation id")

    @classmethod
    def of(
        cls, reservation_id: str | None, resource_group_arn: str | None, *, capacity_block: bool = False
    ) -> CapacityTarget | None:
        """The target the settings name, or None (launch On-Demand wherever EC2 has capacity)."""
        if reservation_id is None and resource_group_arn is None:
            return None
        return cls(reservation_id, resource_group_arn, capacity_block)

    def template_data(self) -> dict[str, Any]:
        """The LaunchTemplateData properties that target it."""
        target = (
            {"CapacityReservationId": self.reservation_id}
            if self.reservation_id
            else {"CapacityReservationResourceGroupArn": self.resource_group_arn}
        )
        data: dict[str, Any] = {"CapacityReservationSpecification": {"CapacityReservationTarget": target}}
        if self.capacity_block:
            data["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
        return data


class TrainingLaunchTemplate(Construct):
    """A launch template for GPU training runs in one subnet; ``grant_launch`` lets a principal start runs from it
    and nothing else."""

    # Long: one LaunchTemplate call holds every property of the instance a run gets (image, volume, metadata options,
    # profile, placement), then the network interfaces per network card, which the L2 construct does not model.
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnet: ec2.ISubnet,
        instance_type: str,
        image_ssm_parameter: str,
        instance_role: iam.IRole,
        instance_profile: iam.IInstanceProfile,
        key: kms.IKey,
        run: TrainingRun,
        root_volume_gib: int = 200,
        efa: bool = False,
        nodes: int = 1,
        capacity: CapacityTarget | None = None,
        version_description: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.capacity = capacity
        self.instance_type = instance_type
        self.image_ssm_parameter = image_ssm_parameter
        self.instance_role = instance_role
        self.instance_profile = instance_profile
        self.key = key
        self.subnet = subnet
        self.efa = efa
        self.multi_node = efa or nodes > 1
        self.security_group = self._security_group(vpc)
        self.placement_group = (
            ec2.PlacementGroup(self, "ClusterPlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER)
            if self.multi_node
            else None
        )
        self.user_data = self._user_data(run)
        self.launch_template = ec2.LaunchTemplate(
            self,
            "TrainingLaunchTemplate",
            version_description=version_description,
            instance_type=ec2.InstanceType(instance_type),
            # The newest DLAMI at each launch (NVIDIA driver, CUDA, EFA, Docker + NVIDIA container toolkit).
            machine_image=ec2.MachineImage.resolve_ssm_parameter_at_launch(
                image_ssm_parameter, os=ec2.OperatingSystemType.LINUX
            ),
            block_devices=[
                ec2.BlockDevice(
                    device_name="/dev/sda1",  # the Ubuntu DLAMI's root device
                    volume=ec2.BlockDeviceVolume.ebs(
                        root_volume_gib,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        encrypted=True,
                        kms_key=key,
                        delete_on_termination=True,
                        # The DLC image build and dataset sync are disk-bound minutes of a ~$30/h instance.
                        iops=6000,
                        throughput=500,
                    ),
                )
            ],
            require_imdsv2=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            # 1 hop (Control Tower CT.EC2.PR.2): a container on Docker's bridge network (single-node runs) cannot
            # reach IMDS, so it gets no credentials; the host does every AWS call. Host-network containers
            # (multi-node and EFA runs) add no hop: ec2_run.sh rejects their packets to IMDS by their uid (iptables
            # owner match), and they run without privileges (docs/training.md, "What a training container can reach").
            http_put_response_hop_limit=METADATA_HOP_LIMIT,
            instance_profile=instance_profile,
            detailed_monitoring=True,
            ebs_optimized=True,
            instance_initiated_shutdown_behavior=ec2.InstanceInitiatedShutdownBehavior.TERMINATE,
            placement_group=self.placement_group,
            user_data=self.user_data,
        )
        # Instances and volumes are named after the template's path, as CDK does, without the hidden "Default".
        name = "/".join(part for part in self.launch_template.node.path.split("/") if part != KEEP_LOGICAL_IDS)
        cdk.Tags.of(self.launch_template).add("Name", name, priority=200)
        # The network interfaces carry the subnet and group, so `run-instances` needs no network arguments (and must
        # not pass any: grant_launch refuses overridden template resources). Multi-node runs share one subnet (one
        # AZ), as a cluster placement group requires.
        # One EFA interface on each of the type's network cards (p4d.24xlarge: 4 x 100 Gbit/s, p5.48xlarge: 32).
        facts = instance_facts(instance_type)
        if efa and not facts.efa:
            raise ValueError(f"efa: {instance_type} has no Elastic Fabric Adapter")
        cards = facts.network_cards if efa else 1
        interfaces = [
            {
                "NetworkCardIndex": card,
                "DeviceIndex": 0 if card == 0 else 1,
                "SubnetId": subnet.subnet_id,
                "Groups": [self.security_group.security_group_id],
                "DeleteOnTermination": True,
                # EC2 refuses AssociatePublicIpAddress, even false, with more than one interface
                # (InvalidParameterCombination; RunInstances InstanceNetworkInterfaceSpecification).
                **({"AssociatePublicIpAddress": False} if cards == 1 else {}),
                **({"InterfaceType": "efa"} if efa else {}),
            }
            for card in range(cards)
        ]
        cfn_template = self.launch_template.node.default_child
        assert isinstance(cfn_template, ec2.CfnLaunchTemplate)
        cfn_template.add_property_override("LaunchTemplateData.NetworkInterfaces", interfaces)
        for name, value in (capacity.template_data() if capacity else {}).items():
            cfn_template.add_property_override(f"LaunchTemplateData.{name}", value)
        if cards > 1:
            acknowledge_control(
                self.launch_template,
                "EC2 refuses AssociatePublicIpAddress (even false) with several network interfaces, and an instance "
                "with several interfaces gets no public address: the subnet is private.",
                "ec2_launch_template_public_ip_disabled_check",
            )

    @property
    def launch_template_id(self) -> str:
        template_id = self.launch_template.launch_template_id
        assert template_id is not None  # always set for a launch template defined in this app
        return template_id

    @property
    def launch_template_arn(self) -> str:
        stack = cdk.Stack.of(self)
        return f"arn:{stack.partition}:ec2:{stack.region}:{stack.account}:launch-template/{self.launch_template_id}"

    # --- network ------------------------------------------------------------------------------------------------

    def _security_group(self, vpc: ec2.IVpc) -> ec2.SecurityGroup:
        group = ec2.SecurityGroup(
            self,
            "TrainingSecurityGroup",
            vpc=vpc,
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

    # --- user data ----------------------------------------------------------------------------------------------

    def _user_data(self, run: TrainingRun) -> ec2.UserData:
        """Fetch the code, run the job, ship the bootstrap log, power off (terminate) whatever happens."""
        region = cdk.Stack.of(self).region
        ship_logs = (
            f"python3 {run.work_dir}/{run.ship_logs_script} --region {region} "
            f'--log-group {run.log_group_name} --log-stream "$(cat {run.work_dir}/stream)" {run.bootstrap_log}'
        )
        user_data = ec2.UserData.for_linux()
        user_data.add_commands(
            "set -euo pipefail",
            f"exec > >(tee -a {run.bootstrap_log}) 2>&1",
            # Whatever happens from here on, the instance ships its log and powers off (and so terminates).
            f"shutdown -h +{run.max_run_hours * 60} 'training run exceeded max_run_hours'",
            f"trap '{ship_logs} || true; shutdown -h now' EXIT",
            f"mkdir -p {run.work_dir} && cd {run.work_dir}",
            "TOKEN=$(curl -sf -X PUT http://169.254.169.254/latest/api/token "
            "-H 'X-aws-ec2-metadata-token-ttl-seconds: 60')",
            "meta() { curl -sf -H \"X-aws-ec2-metadata-token: $TOKEN\" http://169.254.169.254/latest/meta-data/$1; }",
            f"echo \"$(meta reservation-id)/$(meta instance-id)/bootstrap\" > {run.work_dir}/stream",
            *(f"export {name}={shlex.quote(value) if not cdk.Token.is_unresolved(value) else value}"
              for name, value in run.environment.items()),
            # One archive at a time, unpacked under the same path as in the repository (folders may be nested).
            *(f"aws s3 cp --only-show-errors {uri} code.zip && python3 -m zipfile -e code.zip {folder} && rm code.zip"
              for folder, uri in run.code.items()),
            run.run_command,
        )  # fmt: skip
        return user_data

    def grant_launch(self, grantee: iam.IGrantable | iam.ManagedPolicy) -> None:
        """Let ``grantee`` start training runs from this template (see ``launch_statements`` below). A managed
        policy (for people and pipelines) gets the statements directly; any other grantee in its principal policy."""
        statements = launch_statements(self)
        if isinstance(grantee, iam.ManagedPolicy):
            grantee.add_statements(*statements)
            holder: Construct = grantee
        else:
            added = [grantee.grant_principal.add_to_principal_policy(statement) for statement in statements]
            # The acknowledgements go on the policy that received the statements (a role's DefaultPolicy).
            policy = added[0].policy_dependable
            holder = policy if isinstance(policy, Construct) else self
        reasons = {
            "RunTheConfiguredInstanceType": "RunInstances creates instances with generated ids; the launch-template, "
            "template-resource and instance-type conditions bound them.",
            "CreateTheTemplatesVolumesAndInterfaces": "RunInstances creates volumes and interfaces with generated "
            "ids; only those the template specifies are allowed (ec2:IsLaunchTemplateResource).",
            "UseAmazonOwnedImages": "The AMI is whichever DLAMI the public SSM parameter names at launch; "
            "ec2:Owner=amazon and ec2:IsLaunchTemplateResource limit it to that image.",
            "TagAtLaunch": "Tags go on the instances, volumes and interfaces a launch creates (ec2:CreateAction).",
            "LaunchIntoTheReservation": "EC2 picks a reservation of the configured resource group at launch; the "
            "grant alone launches nothing (every other resource needs the launch template).",
        }
        acknowledge_wildcards(holder, *((s, reasons[s.sid]) for s in statements if s.sid in reasons))


# --- who may launch from a template ---------------------------------------------------------------------------


# Long: one statement per resource kind RunInstances authorizes, each with its condition keys and their sources;
# apart, it would not show which resource a condition guards.
def launch_statements(template: TrainingLaunchTemplate) -> list[iam.PolicyStatement]:
    """What ``template.grant_launch`` grants: start runs from the template and nothing broader, even when a caller
    overrides template parameters.

    RunInstances is authorized per resource of the request (AWS EC2 User Guide, "Use launch templates to control
    launching instances"; Service Authorization Reference, Amazon EC2 condition keys): every statement requires
    ``ec2:LaunchTemplate`` = this template and ``ec2:IsLaunchTemplateResource`` = true, so an overridden subnet,
    security group, image, placement group or volume is refused; the instance must be of the configured
    ``ec2:InstanceType`` with IMDSv2 required, the template's hop limit, the training instance profile and default
    tenancy (``_instance_conditions``); the image must be owned by Amazon (the DLAMI the public SSM parameter
    names); a key pair is refused (no key-pair resource). IAM has no condition key for the template's version:
    the grant holds no ec2:CreateLaunchTemplateVersion, so only the versions deployments created can be
    launched, and every resource-level condition above holds for each of them. IAM has no condition on user
    data: the instance role is what bounds a run whose user data was replaced.
    """
    stack = cdk.Stack.of(template)
    ec2_arn = f"arn:{stack.partition}:ec2:{stack.region}:{stack.account}"
    from_template = {
        "ArnLike": {"ec2:LaunchTemplate": template.launch_template_arn},
        "Bool": {"ec2:IsLaunchTemplateResource": "true"},
    }
    launched = [f"{ec2_arn}:{kind}/*" for kind in ("instance", "volume", "network-interface")]
    placement_groups = (
        [f"{ec2_arn}:placement-group/{template.placement_group.placement_group_name}"]
        if template.placement_group
        else []
    )
    return [
        iam.PolicyStatement(
            sid="RunFromTheTrainingTemplate",
            actions=["ec2:RunInstances"],
            resources=[template.launch_template_arn],
            conditions={"ArnLike": from_template["ArnLike"]},
        ),
        iam.PolicyStatement(
            sid="RunTheConfiguredInstanceType",
            actions=["ec2:RunInstances"],
            resources=[f"{ec2_arn}:instance/*"],
            conditions=_instance_conditions(template, from_template),
        ),
        iam.PolicyStatement(
            sid="CreateTheTemplatesVolumesAndInterfaces",
            actions=["ec2:RunInstances"],
            resources=[f"{ec2_arn}:volume/*", f"{ec2_arn}:network-interface/*"],
            conditions=from_template,
        ),
        iam.PolicyStatement(
            sid="UseThePlatformsSubnetAndSecurityGroup",
            actions=["ec2:RunInstances"],
            resources=[
                f"{ec2_arn}:subnet/{template.subnet.subnet_id}",
                f"{ec2_arn}:security-group/{template.security_group.security_group_id}",
                *placement_groups,
            ],
            conditions=from_template,
        ),
        iam.PolicyStatement(
            sid="UseAmazonOwnedImages",
            actions=["ec2:RunInstances"],
            resources=[f"arn:{stack.partition}:ec2:{stack.region}::image/*"],
            conditions={**from_template, "StringEquals": {"ec2:Owner": "amazon"}},
        ),
        *_capacity_statements(template, ec2_arn),
        iam.PolicyStatement(
            sid="TagAtLaunch",
            actions=["ec2:CreateTags"],
            resources=launched,
            conditions={"StringEquals": {"ec2:CreateAction": "RunInstances"}},
        ),
        iam.PolicyStatement(
            sid="PassTheTrainingInstanceRole",
            actions=["iam:PassRole"],
            resources=[template.instance_role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
        ),
        iam.PolicyStatement(
            sid="EncryptTheRootVolume",
            actions=["kms:CreateGrant", "kms:GenerateDataKeyWithoutPlaintext", "kms:Decrypt", "kms:DescribeKey"],
            resources=[template.key.key_arn],
            conditions={"StringEquals": {"kms:ViaService": f"ec2.{stack.region}.{stack.url_suffix}"}},
        ),
        iam.PolicyStatement(
            sid="ReadTheDlamiParameter",
            actions=["ssm:GetParameters"],
            resources=[f"arn:{stack.partition}:ssm:{stack.region}::parameter{template.image_ssm_parameter}"],
        ),
    ]


def _capacity_statements(template: TrainingLaunchTemplate, ec2_arn: str) -> list[iam.PolicyStatement]:
    """RunInstances into a reservation is also authorized on the capacity-reservation resource (Service
    Authorization Reference, RunInstances resource types; karpenter-provider-aws pull 7801). A group's member is
    chosen by EC2 at launch, so any reservation of the account and region. No condition: this grant alone launches
    nothing, every other resource of the launch still needs the template conditions above."""
    if template.capacity is None:
        return []
    reservation = template.capacity.reservation_id or "*"
    return [
        iam.PolicyStatement(
            sid="LaunchIntoTheReservation",
            actions=["ec2:RunInstances"],
            resources=[f"{ec2_arn}:capacity-reservation/{reservation}"],
        )
    ]


def _instance_conditions(
    template: TrainingLaunchTemplate, from_template: dict[str, dict[str, str]]
) -> dict[str, dict[str, Any]]:
    """The instance resource of RunInstances: the template's type, IMDSv2 with its hop limit, its instance
    profile and default tenancy, whatever the caller overrides. Condition keys of RunInstances on the instance
    resource (Service Authorization Reference, "Condition keys for Amazon EC2": ec2:InstanceType,
    ec2:MetadataHttpTokens, ec2:MetadataHttpPutResponseHopLimit, ec2:InstanceProfile, ec2:Tenancy; EC2 User Guide,
    "Require the use of IMDSv2" and "Example: Work with instance metadata" policies)."""
    profile_arn = template.instance_profile.instance_profile_arn
    return {
        "ArnLike": {**from_template["ArnLike"], "ec2:InstanceProfile": profile_arn},
        "Bool": from_template["Bool"],
        "StringEquals": {
            "ec2:InstanceType": template.instance_type,
            "ec2:MetadataHttpTokens": "required",
            "ec2:Tenancy": "default",
        },
        "NumericLessThanEquals": {"ec2:MetadataHttpPutResponseHopLimit": str(METADATA_HOP_LIMIT)},
    }
