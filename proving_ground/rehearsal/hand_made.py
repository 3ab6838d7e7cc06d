"""The resources moto's CloudFormation cannot create, created (and deleted) by hand through the services' APIs with
every policy the template gives them, each as CloudFormation or the resource's handler would make the calls.

``NOT_PLAYED``: a type moto's CloudFormation parses but that the rehearsal makes itself, and why. ``NOT_EMULATED``:
a type moto has no API for at all (the rehearsal keeps its name so that the resources naming it resolve).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proving_ground.rehearsal.journey import ACCOUNT, StepFailed

if TYPE_CHECKING:
    from proving_ground.rehearsal.deployment import Deployment

NOT_PLAYED = {
    # moto 5.2.5's CloudFormation passes the key's Tags as Key/Value to a tagger that reads TagKey (KeyError).
    "AWS::KMS::Key": "moto's CloudFormation fails on the key's tags: made through the KMS API with its key policy",
    # moto 5.2.5 reads an SSM parameter's Tags as a list of Key/Value; the resource schema's is a map (TypeError).
    "AWS::SSM::Parameter": "moto's CloudFormation fails on its Tags (a map in the schema, a list to moto): made "
    "through SSM's PutParameter with its tags",
    # moto refuses /aws/service/... SSM parameters, which the template's ImageId resolves.
    "AWS::EC2::LaunchTemplate": "its ImageId is a public /aws/service SSM parameter moto refuses: made through the "
    "EC2 API with moto's Deep Learning AMI and without the placement group",
}
NOT_EMULATED = {"AWS::EC2::PlacementGroup": "moto 5.2.5 has no placement groups (RunInstances is still checked)"}

Creator = Callable[["Deployment", str, str, dict[str, Any]], str]
Deleter = Callable[["Deployment", str, str], None]


def _physical(stack_name: str, logical: str, limit: int = 63) -> str:
    """A CloudFormation-style generated name: stack name and logical id."""
    return f"{stack_name}-{logical}"[:limit]


def key(d: Deployment, stack_id: str, logical: str, props: dict[str, Any]) -> str:
    """The KMS key with its key policy (CreateKey's Policy), rotation as the template asks."""
    resolved = d.resolve(stack_id, props)
    kms = d.client("kms")
    created = kms.create_key(
        Policy=json.dumps(resolved["KeyPolicy"]),
        Description=str(resolved.get("Description", logical)),
        KeyUsage=resolved.get("KeyUsage", "ENCRYPT_DECRYPT"),
    )["KeyMetadata"]
    if resolved.get("EnableKeyRotation"):
        kms.enable_key_rotation(KeyId=created["KeyId"])
    return d.set_ref(stack_id, logical, created["KeyId"], Arn=created["Arn"], KeyId=created["KeyId"])


def delete_key(d: Deployment, stack_id: str, logical: str) -> None:
    """CloudFormation schedules a deleted key's deletion after its PendingWindowInDays (7 to 30, 30 when unset)."""
    props = d.stacks[stack_id].template["Resources"][logical].get("Properties", {})
    days = int(props.get("PendingWindowInDays", 30))
    d.client("kms").schedule_key_deletion(KeyId=d.deployed[stack_id].refs[logical], PendingWindowInDays=days)


def placement_group(d: Deployment, stack_id: str, logical: str, props: dict[str, Any]) -> str:
    name = _physical(d.stacks[stack_id].stack_name, logical, 255)
    return d.set_ref(stack_id, logical, name, GroupName=name)


def launch_template(d: Deployment, stack_id: str, logical: str, props: dict[str, Any]) -> str:
    data = dict(props["LaunchTemplateData"])
    user_data = d.resolve(stack_id, data.pop("UserData")["Fn::Base64"])
    resolved = d.resolve(stack_id, data)
    ec2 = d.client("ec2")
    # moto's Amazon-owned Deep Learning AMI (by name: all 1,300 of moto's images cost seconds to list and parse).
    dlami = [{"Name": "name", "Values": ["Deep Learning AMI Amazon Linux*"]}]
    image = ec2.describe_images(Owners=["amazon"], Filters=dlami)["Images"][0]["ImageId"]
    emulated = {k: v for k, v in resolved.items() if k != "Placement"}
    emulated["ImageId"] = image
    emulated["UserData"] = base64.b64encode(user_data.encode()).decode()
    name = _physical(d.stacks[stack_id].stack_name, logical, 128)
    template = ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData=emulated)["LaunchTemplate"]
    template_id = template["LaunchTemplateId"]
    profile = resolved["IamInstanceProfile"]["Arn"].rsplit("/", 1)[-1]
    (role,) = d.client("iam").get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"]
    d.launch_templates[template_id] = {
        "arn": f"arn:aws:ec2:{d.region}:{ACCOUNT}:launch-template/{template_id}",
        "data": resolved,
        "image_id": image,
        "image_owner": "amazon",
        "instance_role_arn": role["Arn"],
        "user_data": user_data,
    }
    return d.set_ref(stack_id, logical, template_id, LatestVersionNumber="1", DefaultVersionNumber="1")


def delete_launch_template(d: Deployment, stack_id: str, logical: str) -> None:
    d.client("ec2").delete_launch_template(LaunchTemplateId=d.deployed[stack_id].refs[logical])


def parameter(d: Deployment, stack_id: str, logical: str, props: dict[str, Any]) -> str:
    resolved = d.resolve(stack_id, props)
    tags = [{"Key": k, "Value": v} for k, v in resolved.get("Tags", {}).items()]
    options = {k: resolved[k] for k in ("Description", "Tier", "AllowedPattern", "DataType") if k in resolved}
    d.client("ssm").put_parameter(Name=resolved["Name"], Value=resolved["Value"], Type=resolved["Type"], Tags=tags,
                                  **options)  # fmt: skip
    return d.set_ref(stack_id, logical, resolved["Name"], Type=resolved["Type"], Value=resolved["Value"])


def delete_parameter(d: Deployment, stack_id: str, logical: str) -> None:
    d.client("ssm").delete_parameter(Name=d.deployed[stack_id].refs[logical])


def _permission(rule: dict[str, Any]) -> dict[str, Any]:
    permission: dict[str, Any] = {"IpProtocol": str(rule["IpProtocol"])}
    for name in ("FromPort", "ToPort"):
        if name in rule:
            permission[name] = int(rule[name])
    if "CidrIp" in rule:
        permission["IpRanges"] = [{"CidrIp": rule["CidrIp"], "Description": rule.get("Description", "")}]
    for name in ("DestinationSecurityGroupId", "SourceSecurityGroupId"):
        if name in rule:
            permission["UserIdGroupPairs"] = [{"GroupId": rule[name], "Description": rule.get("Description", "")}]
    return permission


def security_group_egress(d: Deployment, stack_id: str, logical: str, props: dict[str, Any]) -> str:
    resolved = d.resolve(stack_id, props)
    d.client("ec2").authorize_security_group_egress(GroupId=resolved["GroupId"], IpPermissions=[_permission(resolved)])
    return d.set_ref(stack_id, logical, f"{resolved['GroupId']}|egress|{logical}")


def bucket_policy(d: Deployment, stack_id: str, logical: str, props: dict[str, Any]) -> str:
    resolved = d.resolve(stack_id, props)
    d.client("s3").put_bucket_policy(Bucket=resolved["Bucket"], Policy=json.dumps(resolved["PolicyDocument"]))
    return d.set_ref(stack_id, logical, resolved["Bucket"])


def topic_policy(d: Deployment, stack_id: str, logical: str, props: dict[str, Any]) -> str:
    resolved = d.resolve(stack_id, props)
    for topic in resolved["Topics"]:
        d.client("sns").set_topic_attributes(
            TopicArn=topic, AttributeName="Policy", AttributeValue=json.dumps(resolved["PolicyDocument"])
        )
    return d.set_ref(stack_id, logical, ",".join(resolved["Topics"]))


_ALARM_KEYS = ("AlarmName", "AlarmDescription", "ActionsEnabled", "OKActions", "AlarmActions",
               "InsufficientDataActions", "MetricName", "Namespace", "Statistic", "ExtendedStatistic", "Dimensions",
               "Period", "Unit", "EvaluationPeriods", "DatapointsToAlarm", "Threshold", "ComparisonOperator",
               "TreatMissingData", "EvaluateLowSampleCountPercentile", "Metrics", "ThresholdMetricId")  # fmt: skip


def alarm(d: Deployment, stack_id: str, logical: str, props: dict[str, Any]) -> str:
    resolved = d.resolve(stack_id, props)
    name = resolved.get("AlarmName") or _physical(d.stacks[stack_id].stack_name, logical, 255)
    arguments = {k: resolved[k] for k in _ALARM_KEYS if k in resolved}
    d.client("cloudwatch").put_metric_alarm(**{**arguments, "AlarmName": name})
    arn = f"arn:aws:cloudwatch:{d.region}:{ACCOUNT}:alarm:{name}"
    return d.set_ref(stack_id, logical, name, Arn=arn)


def delete_alarm(d: Deployment, stack_id: str, logical: str) -> None:
    d.client("cloudwatch").delete_alarms(AlarmNames=[d.deployed[stack_id].refs[logical]])


def scalable_target(d: Deployment, stack_id: str, logical: str, props: dict[str, Any]) -> str:
    resolved = d.resolve(stack_id, props)
    keys = ("ServiceNamespace", "ResourceId", "ScalableDimension", "MinCapacity", "MaxCapacity")
    d.client("application-autoscaling").register_scalable_target(**{k: resolved[k] for k in keys})
    ref = f"{resolved['ResourceId']}|{resolved['ScalableDimension']}|{resolved['ServiceNamespace']}"
    return d.set_ref(stack_id, logical, ref)


def delete_scalable_target(d: Deployment, stack_id: str, logical: str) -> None:
    resource_id, dimension, namespace = d.deployed[stack_id].refs[logical].split("|")
    autoscaling = d.client("application-autoscaling")
    registered = autoscaling.describe_scalable_targets(ServiceNamespace=namespace, ResourceIds=[resource_id])
    if registered["ScalableTargets"]:  # change-endpoint-instance may have deregistered and registered it again
        autoscaling.deregister_scalable_target(
            ServiceNamespace=namespace, ResourceId=resource_id, ScalableDimension=dimension
        )


def scaling_policy(d: Deployment, stack_id: str, logical: str, props: dict[str, Any]) -> str:
    resolved = d.resolve(stack_id, props)
    resource_id, dimension, namespace = resolved.pop("ScalingTargetId").split("|")
    arn = d.client("application-autoscaling").put_scaling_policy(
        ServiceNamespace=namespace, ResourceId=resource_id, ScalableDimension=dimension, **resolved
    )["PolicyARN"]
    return d.set_ref(stack_id, logical, arn)


def restrict_default_security_group(d: Deployment, stack_id: str, logical: str, props: dict[str, Any]) -> str:
    """CDK's Custom::VpcRestrictDefaultSG handler: the VPC's default group loses its rules (RevokeSecurityGroup*)."""
    resolved = d.resolve(stack_id, props)
    ec2 = d.client("ec2")
    (group,) = ec2.describe_security_groups(GroupIds=[resolved["DefaultSecurityGroupId"]])["SecurityGroups"]
    if group["IpPermissions"]:
        ec2.revoke_security_group_ingress(GroupId=group["GroupId"], IpPermissions=group["IpPermissions"])
    if group["IpPermissionsEgress"]:
        ec2.revoke_security_group_egress(GroupId=group["GroupId"], IpPermissions=group["IpPermissionsEgress"])
    return d.set_ref(stack_id, logical, f"{group['GroupId']}-restricted")


def nothing_on_create(d: Deployment, stack_id: str, logical: str, props: dict[str, Any]) -> str:
    """A custom resource whose handler does nothing on Create (EniReleaseWait, S3AutoDeleteObjects)."""
    return d.set_ref(stack_id, logical, f"{logical}-{d.stacks[stack_id].stack_name}")


def empty_bucket(d: Deployment, stack_id: str, logical: str) -> None:
    """CDK's Custom::S3AutoDeleteObjects handler on Delete: every object version of the bucket deleted."""
    bucket = d.resolve(stack_id, d.stacks[stack_id].template["Resources"][logical]["Properties"]["BucketName"])
    s3 = d.client("s3")
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        objects = [{"Key": v["Key"], "VersionId": v["VersionId"]}
                   for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]  # fmt: skip
        if objects:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": objects})


CREATORS: dict[str, Creator] = {
    "AWS::KMS::Key": key,
    "AWS::EC2::PlacementGroup": placement_group,
    "AWS::EC2::LaunchTemplate": launch_template,
    "AWS::SSM::Parameter": parameter,
    "AWS::EC2::SecurityGroupEgress": security_group_egress,
    "AWS::S3::BucketPolicy": bucket_policy,
    "AWS::SNS::TopicPolicy": topic_policy,
    "AWS::CloudWatch::Alarm": alarm,
    "AWS::ApplicationAutoScaling::ScalableTarget": scalable_target,
    "AWS::ApplicationAutoScaling::ScalingPolicy": scaling_policy,
    "Custom::VpcRestrictDefaultSG": restrict_default_security_group,
    "Custom::EniReleaseWait": nothing_on_create,
    "Custom::S3AutoDeleteObjects": nothing_on_create,
}
# What deleting them takes (the others go with what they belong to: a bucket's policy with the bucket, a scaling
# policy with its target, a rule with its group; ENI release waits: Deployment.custom_deleters).
DELETERS: dict[str, Deleter] = {
    "AWS::KMS::Key": delete_key,
    "AWS::EC2::LaunchTemplate": delete_launch_template,
    "AWS::SSM::Parameter": delete_parameter,
    "AWS::CloudWatch::Alarm": delete_alarm,
    "AWS::ApplicationAutoScaling::ScalableTarget": delete_scalable_target,
    "Custom::S3AutoDeleteObjects": empty_bucket,
}


def _network_deleters() -> dict[str, Deleter]:
    """CloudFormation's deletion of the network types moto's CloudFormation cannot delete (their moto models have
    no delete): each by its EC2 call, in the order ``NETWORK_DELETION_ORDER``."""

    def ec2(d: Deployment) -> Any:
        return d.client("ec2")

    def ref(d: Deployment, stack_id: str, logical: str) -> Any:
        return d.deployed[stack_id].refs[logical]

    def props(d: Deployment, stack_id: str, logical: str) -> Any:
        return d.resolve(stack_id, d.stacks[stack_id].template["Resources"][logical]["Properties"])

    def route(d: Deployment, s: str, k: str) -> None:
        p = props(d, s, k)
        ec2(d).delete_route(RouteTableId=p["RouteTableId"], DestinationCidrBlock=p["DestinationCidrBlock"])

    def attachment(d: Deployment, s: str, k: str) -> None:
        p = props(d, s, k)
        ec2(d).detach_internet_gateway(InternetGatewayId=p["InternetGatewayId"], VpcId=p["VpcId"])

    def association(d: Deployment, s: str, k: str) -> None:
        # moto's Ref of an association is its route table's id: the association is found by its subnet.
        p = props(d, s, k)
        (table,) = ec2(d).describe_route_tables(RouteTableIds=[p["RouteTableId"]])["RouteTables"]
        for found in [a for a in table["Associations"] if a.get("SubnetId") == p["SubnetId"]]:
            ec2(d).disassociate_route_table(AssociationId=found["RouteTableAssociationId"])

    return {
        "AWS::EC2::VPCEndpoint": lambda d, s, k: ec2(d).delete_vpc_endpoints(VpcEndpointIds=[ref(d, s, k)]),
        "AWS::EC2::NatGateway": lambda d, s, k: ec2(d).delete_nat_gateway(NatGatewayId=ref(d, s, k)),
        "AWS::EC2::FlowLog": lambda d, s, k: ec2(d).delete_flow_logs(FlowLogIds=[ref(d, s, k)]),
        "AWS::EC2::Route": route,
        "AWS::EC2::SubnetRouteTableAssociation": association,
        "AWS::EC2::EIP": lambda d, s, k: ec2(d).release_address(AllocationId=ref(d, s, f"{k}.AllocationId")),
        "AWS::EC2::VPCGatewayAttachment": attachment,
        "AWS::EC2::InternetGateway": lambda d, s, k: ec2(d).delete_internet_gateway(InternetGatewayId=ref(d, s, k)),
        "AWS::EC2::RouteTable": lambda d, s, k: ec2(d).delete_route_table(RouteTableId=ref(d, s, k)),
    }


NETWORK_DELETERS = _network_deleters()
NETWORK_DELETION_ORDER = list(NETWORK_DELETERS)


def creator(kind: str) -> Creator:
    if kind not in CREATORS:
        raise StepFailed(f"{kind}: neither moto's CloudFormation nor the rehearsal creates it")
    return CREATORS[kind]


def sagemaker_arn(arn: str) -> str:
    """SageMaker lower-cases resource names in its ARNs (moto keeps their case)."""
    prefix, _, name = arn.rpartition("/")
    return f"{prefix}/{name.lower()}"
