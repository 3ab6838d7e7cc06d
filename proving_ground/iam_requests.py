"""From synthesized templates and recorded API calls to the IAM requests that ``ops_review.iam_policy`` (the platform's
policy evaluator, which the product's review uses too) decides: a template's roles and their policies by CDK id, and
the API-call-to-action map (shared by the tests and the rehearsal's call gate).

An API operation with no entry in ``OPERATIONS`` raises ``Unsupported``, so a call this map does not know can never
pass silently.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ops_review.iam_policy import ContextValue, Request, Unsupported, resolve

# ---------------------------------------------------------------------------------------- templates


def logical_id(template: dict[str, Any], resource_type: str, prefix: str) -> str:
    """The one logical id of ``resource_type`` whose CDK id starts with ``prefix``."""
    (found,) = [
        name
        for name, resource in template["Resources"].items()
        if resource["Type"] == resource_type and re.fullmatch(rf"{re.escape(prefix)}[0-9A-F]{{8}}", name)
    ]
    return found


def role_policies(template: dict[str, Any], role_id: str, refs: dict[str, Any]) -> list[dict[str, Any]]:
    """Every identity policy of a role in the template: inline, and managed policies naming the role."""
    policies = [resolve(p["PolicyDocument"], refs=refs)
                for p in template["Resources"][role_id]["Properties"].get("Policies", [])]  # fmt: skip
    for resource in template["Resources"].values():
        if resource["Type"] in ("AWS::IAM::ManagedPolicy", "AWS::IAM::Policy") and {"Ref": role_id} in resource[
            "Properties"
        ].get("Roles", []):
            policies.append(resolve(resource["Properties"]["PolicyDocument"], refs=refs))
    if template["Resources"][role_id]["Properties"].get("ManagedPolicyArns"):
        raise Unsupported("managed policies attached by ARN")
    return policies


# ------------------------------------------------------------------------------------ API calls -> IAM requests


@dataclass(frozen=True)
class Call:
    """One API call as botocore makes it."""

    service: str  # botocore service name: s3, sagemaker, logs, sts, ...
    operation: str  # CreateTrainingJob, PutObject, ...
    params: dict[str, Any]
    region: str
    account: str


def _s3_object(call: Call) -> str:
    return f"arn:aws:s3:::{call.params['Bucket']}/{call.params['Key']}"


def _s3_bucket(call: Call) -> str:
    return f"arn:aws:s3:::{call.params['Bucket']}"


def _arn(call: Call, service: str, resource: str) -> str:
    return f"arn:aws:{service}:{call.region}:{call.account}:{resource}"


def _log_group(call: Call) -> str:
    return _arn(call, "logs", f"log-group:{call.params['logGroupName']}")


def _log_stream(call: Call) -> str:
    return f"{_log_group(call)}:log-stream:{call.params['logStreamName']}"


def _s3_copy_source(call: Call) -> str:
    source = call.params["CopySource"]
    if isinstance(source, str):
        bucket, _, key = source.lstrip("/").partition("/")
        return f"arn:aws:s3:::{bucket}/{key}"
    return f"arn:aws:s3:::{source['Bucket']}/{source['Key']}"


def _stack(call: Call) -> str:
    name = call.params.get("StackName", "*")
    if name.startswith("arn:"):
        return str(name)
    return _arn(call, "cloudformation", f"stack/{name}/*")


def _endpoint(call: Call) -> str:
    return _arn(call, "sagemaker", f"endpoint/{call.params['EndpointName'].lower()}")


def _quota(call: Call) -> str:
    return _arn(call, "servicequotas", f"{call.params['ServiceCode']}/{call.params['QuotaCode']}")


def _key(call: Call, key: str) -> str:
    if key.startswith("arn:"):
        return key
    return _arn(call, "kms", key if key.startswith("alias/") else f"key/{key}")


# operation -> (IAM action, resource ARN builder). Documented in the Service Authorization Reference.
OPERATIONS: dict[tuple[str, str], list[tuple[str, Callable[[Call], str]]]] = {
    ("s3", "PutObject"): [("s3:PutObject", _s3_object)],
    ("s3", "CreateMultipartUpload"): [("s3:PutObject", _s3_object)],
    ("s3", "UploadPart"): [("s3:PutObject", _s3_object)],
    ("s3", "CompleteMultipartUpload"): [("s3:PutObject", _s3_object)],
    ("s3", "AbortMultipartUpload"): [("s3:AbortMultipartUpload", _s3_object)],
    ("s3", "GetObject"): [("s3:GetObject", _s3_object)],
    ("s3", "HeadObject"): [("s3:GetObject", _s3_object)],
    ("s3", "ListObjectsV2"): [("s3:ListBucket", _s3_bucket)],
    ("s3", "ListObjects"): [("s3:ListBucket", _s3_bucket)],
    ("s3", "HeadBucket"): [("s3:ListBucket", _s3_bucket)],
    ("s3", "GetBucketLocation"): [("s3:GetBucketLocation", _s3_bucket)],
    ("s3", "CreateBucket"): [("s3:CreateBucket", _s3_bucket)],
    ("s3", "ListBuckets"): [("s3:ListAllMyBuckets", lambda call: "*")],
    ("sagemaker", "CreateTrainingJob"): [
        ("sagemaker:CreateTrainingJob", lambda c: _arn(c, "sagemaker", f"training-job/{c.params['TrainingJobName']}"))
    ],
    ("sagemaker", "DescribeTrainingJob"): [
        ("sagemaker:DescribeTrainingJob", lambda c: _arn(c, "sagemaker", f"training-job/{c.params['TrainingJobName']}"))
    ],
    ("sagemaker", "AddTags"): [("sagemaker:AddTags", lambda c: c.params["ResourceArn"])],
    ("sagemaker", "StopTrainingJob"): [
        ("sagemaker:StopTrainingJob", lambda c: _arn(c, "sagemaker", f"training-job/{c.params['TrainingJobName']}"))
    ],
    # CloudWatch Logs evaluates log-group actions against the group ARN with and without ":*" depending on the
    # action; both forms are checked, so a policy that grants one of them only fails here.
    ("logs", "DescribeLogStreams"): [
        ("logs:DescribeLogStreams", _log_group),
        ("logs:DescribeLogStreams", lambda c: f"{_log_group(c)}:*"),
    ],
    ("logs", "GetLogEvents"): [
        ("logs:GetLogEvents", lambda c: f"{_log_group(c)}:log-stream:{c.params['logStreamName']}")
    ],
    # Parameter ARNs drop the name's leading slash: arn:aws:ssm:<region>:<account>:parameter/a/b.
    ("ssm", "GetParameter"): [
        ("ssm:GetParameter", lambda c: _arn(c, "ssm", f"parameter/{c.params['Name'].lstrip('/')}"))
    ],
    # "No permissions are required to perform this operation" (STS API reference, GetCallerIdentity).
    ("sts", "GetCallerIdentity"): [],
    # Log streams: arn:...:log-group:<group>:log-stream:<stream> (CloudWatch Logs user guide, "Overview of managing
    # access permissions to your CloudWatch Logs resources"), as AWS names it in its AccessDenied messages.
    ("logs", "CreateLogStream"): [("logs:CreateLogStream", _log_stream)],
    ("logs", "PutLogEvents"): [("logs:PutLogEvents", _log_stream)],
    ("logs", "DeleteLogStream"): [("logs:DeleteLogStream", _log_stream)],
    ("logs", "DeleteLogGroup"): [("logs:DeleteLogGroup", lambda c: f"{_log_group(c)}:*")],
    ("logs", "DescribeLogGroups"): [("logs:DescribeLogGroups", lambda c: _arn(c, "logs", "log-group:*"))],
    # Actions without resource-level permissions are evaluated against "*" (Service Authorization Reference).
    ("ec2", "DescribeInstances"): [("ec2:DescribeInstances", lambda c: "*")],
    ("ec2", "DescribeNetworkInterfaces"): [("ec2:DescribeNetworkInterfaces", lambda c: "*")],
    ("ec2", "DescribeInstanceTypeOfferings"): [("ec2:DescribeInstanceTypeOfferings", lambda c: "*")],
    ("ec2", "DescribeInstanceTypes"): [("ec2:DescribeInstanceTypes", lambda c: "*")],
    ("ec2", "DescribeAvailabilityZones"): [("ec2:DescribeAvailabilityZones", lambda c: "*")],
    ("ec2", "DescribeSubnets"): [("ec2:DescribeSubnets", lambda c: "*")],
    ("ec2", "DescribeCapacityReservations"): [("ec2:DescribeCapacityReservations", lambda c: "*")],
    ("ecr", "GetAuthorizationToken"): [("ecr:GetAuthorizationToken", lambda c: "*")],
    ("s3", "CopyObject"): [("s3:PutObject", _s3_object), ("s3:GetObject", _s3_copy_source)],
    ("s3", "DeleteObject"): [("s3:DeleteObject", _s3_object)],
    ("cloudformation", "DescribeStacks"): [("cloudformation:DescribeStacks", _stack)],
    ("cloudformation", "ListStacks"): [("cloudformation:ListStacks", lambda c: "*")],
    ("cloudformation", "ListStackResources"): [("cloudformation:ListStackResources", _stack)],
    # SageMaker lower-cases names in endpoint ARNs.
    ("sagemaker", "DescribeEndpoint"): [("sagemaker:DescribeEndpoint", _endpoint)],
    ("sagemaker", "ListEndpoints"): [("sagemaker:ListEndpoints", lambda c: "*")],
    ("sagemaker", "DescribeEndpointConfig"): [
        (
            "sagemaker:DescribeEndpointConfig",
            lambda c: _arn(c, "sagemaker", f"endpoint-config/{c.params['EndpointConfigName'].lower()}"),
        )
    ],
    ("sagemaker-runtime", "InvokeEndpoint"): [("sagemaker:InvokeEndpoint", _endpoint)],
    # Application Auto Scaling: scalable targets are matched on "*" here (their ARNs carry an id the caller never
    # sees); the calls it makes to SageMaker and CloudWatch with the caller's permissions are below in requests_for.
    **{
        ("application-autoscaling", operation): [(f"application-autoscaling:{operation}", lambda c: "*")]
        for operation in (
            "DescribeScalableTargets",
            "DescribeScalingPolicies",
            "RegisterScalableTarget",
            "DeregisterScalableTarget",
            "PutScalingPolicy",
            "DeleteScalingPolicy",
        )
    },
    ("service-quotas", "GetServiceQuota"): [("servicequotas:GetServiceQuota", _quota)],
    ("service-quotas", "GetAWSDefaultServiceQuota"): [("servicequotas:GetAWSDefaultServiceQuota", _quota)],
    ("service-quotas", "ListServiceQuotas"): [("servicequotas:ListServiceQuotas", lambda c: "*")],
    ("service-quotas", "ListAWSDefaultServiceQuotas"): [("servicequotas:ListAWSDefaultServiceQuotas", lambda c: "*")],
    ("kms", "DescribeKey"): [("kms:DescribeKey", lambda c: _key(c, c.params["KeyId"]))],
    # Decrypt names the key in the ciphertext; a caller who names none is decided by it: unknown here, so refused.
    ("kms", "Decrypt"): [("kms:Decrypt", lambda c: _key(c, c.params.get("KeyId", "unknown")))],
}

# What Application Auto Scaling does with the caller's permissions (Application Auto Scaling user guide,
# "Identity-based policy examples": "Permissions required for API actions on target services and CloudWatch"):
# registering a SageMaker variant describes and updates the endpoint; a target-tracking policy creates and deletes
# CloudWatch alarms.
_AUTOSCALING_ON_BEHALF: dict[str, list[str]] = {
    "RegisterScalableTarget": [
        "sagemaker:DescribeEndpoint",
        "sagemaker:DescribeEndpointConfig",
        "sagemaker:UpdateEndpointWeightsAndCapacities",
    ],
    "PutScalingPolicy": ["cloudwatch:DescribeAlarms", "cloudwatch:PutMetricAlarm"],
    "DeleteScalingPolicy": ["cloudwatch:DescribeAlarms", "cloudwatch:DeleteAlarms"],
}


def _instance_keys(data: Mapping[str, Any]) -> dict[str, ContextValue]:
    """The instance's condition keys, from the template's data: EC2 evaluates a launch template's parameters as if the
    request had named them (EC2 User Guide, "Control the use of launch templates"; the same holds for SCPs that
    require IMDSv2 with ec2:MetadataHttpTokens)."""
    metadata = data.get("MetadataOptions") or {}
    keys: dict[str, ContextValue] = {
        "ec2:InstanceType": data["InstanceType"],
        "ec2:Tenancy": (data.get("Placement") or {}).get("Tenancy", "default"),
        # IMDS defaults when the template leaves them out: tokens optional, hop limit 1.
        "ec2:MetadataHttpTokens": metadata.get("HttpTokens", "optional"),
        "ec2:MetadataHttpPutResponseHopLimit": str(metadata.get("HttpPutResponseHopLimit", 1)),
    }
    profile = (data.get("IamInstanceProfile") or {}).get("Arn")
    if profile:
        keys["ec2:InstanceProfile"] = profile
    return keys


def _tags(tags: list[dict[str, str]] | None) -> dict[str, ContextValue]:
    tags = tags or []
    return {**{f"aws:RequestTag/{t['Key']}": t["Value"] for t in tags}, "aws:TagKeys": [t["Key"] for t in tags]}


def _create_training_job_context(params: dict[str, Any]) -> dict[str, ContextValue]:
    """The condition keys SageMaker fills for CreateTrainingJob from the request (Service Authorization Reference,
    "Actions, resources, and condition keys for Amazon SageMaker": CreateTrainingJob)."""
    context: dict[str, ContextValue] = {"sagemaker:InstanceTypes": [params["ResourceConfig"]["InstanceType"]]}
    vpc = params.get("VpcConfig") or {}
    if vpc:
        context["sagemaker:VpcSubnets"] = list(vpc["Subnets"])
        context["sagemaker:VpcSecurityGroupIds"] = list(vpc["SecurityGroupIds"])
    if params["ResourceConfig"].get("VolumeKmsKeyId"):
        context["sagemaker:VolumeKmsKey"] = params["ResourceConfig"]["VolumeKmsKeyId"]
    if params.get("OutputDataConfig", {}).get("KmsKeyId"):
        context["sagemaker:OutputKmsKey"] = params["OutputDataConfig"]["KmsKeyId"]
    if "MaxRuntimeInSeconds" in params.get("StoppingCondition", {}):
        context["sagemaker:MaxRuntimeInSeconds"] = str(params["StoppingCondition"]["MaxRuntimeInSeconds"])
    for parameter, key in (("EnableInterContainerTrafficEncryption", "sagemaker:InterContainerTrafficEncryption"),
                           ("EnableNetworkIsolation", "sagemaker:NetworkIsolation")):  # fmt: skip
        if parameter in params:
            context[key] = str(bool(params[parameter])).lower()
    return context


def _s3_context(params: dict[str, Any]) -> dict[str, ContextValue]:
    """The S3 condition keys the platform's policies use (Amazon S3 condition key reference; ``s3:if-none-match``: the
    conditional write's header, S3 User Guide, "Enforce conditional writes on Amazon S3 buckets")."""
    names = {"Prefix": "s3:prefix", "ServerSideEncryption": "s3:x-amz-server-side-encryption",
             "IfNoneMatch": "s3:if-none-match",
             "SSEKMSKeyId": "s3:x-amz-server-side-encryption-aws-kms-key-id",
             "SSECustomerAlgorithm": "s3:x-amz-server-side-encryption-customer-algorithm"}  # fmt: skip
    return {key: str(params[name]) for name, key in names.items() if name in params}


def _on_behalf_resource(call: Call, action: str) -> str:
    """The resource of a request Application Auto Scaling makes for the caller: the variant's endpoint, its
    configs, or the target-tracking alarms it names ``TargetTracking-<resource id>-AlarmHigh-<uuid>`` (and
    ``-AlarmLow-``)."""
    resource_id = str(call.params.get("ResourceId", ""))
    if action in ("sagemaker:DescribeEndpoint", "sagemaker:UpdateEndpointWeightsAndCapacities"):
        return _arn(call, "sagemaker", f"endpoint/{resource_id.split('/')[1].lower()}")
    if action == "sagemaker:DescribeEndpointConfig":
        return _arn(call, "sagemaker", "endpoint-config/*")
    if action in ("cloudwatch:PutMetricAlarm", "cloudwatch:DeleteAlarms"):
        return _arn(call, "cloudwatch", f"alarm:TargetTracking-{resource_id}-AlarmHigh")
    return "*"


# Long: one branch per API call whose IAM requests differ from the call's own (RunInstances, S3 on KMS-encrypted
# buckets, copies, tagging, autoscaling on the caller's behalf, TargetModel, training jobs), as the Service
# Authorization Reference lists them
def requests_for(
    call: Call,
    *,
    kms_encrypted_buckets: dict[str, str],
    principal: Mapping[str, ContextValue] | None = None,
    resource_tags: Callable[[str], dict[str, str]] | None = None,
    launch_templates: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Request]:
    """The IAM requests one API call needs, including the ones a service makes with the caller's permissions.

    ``kms_encrypted_buckets`` maps bucket names to the KMS key ARN of their default SSE-KMS encryption: S3 calls
    KMS as the caller (kms:GenerateDataKey to write, kms:Decrypt to read; S3 user guide, "Using SSE-KMS").
    CreateTrainingJob also needs iam:PassRole on its role (passed to sagemaker.amazonaws.com) and, with tags,
    sagemaker:AddTags with sagemaker:TaggingAction = CreateTrainingJob (SageMaker developer guide, "Tag-based access
    control"). ``principal``: the caller's global
    condition keys (aws:userid, aws:PrincipalArn, aws:PrincipalAccount); ``resource_tags``: the tags of an existing
    resource by ARN (aws:ResourceTag/<key> of Describe and Stop); ``launch_templates``: what RunInstances from
    each launch template id creates (see ``run_instances_requests``).
    """
    key = (call.service, call.operation)
    if key == ("ec2", "RunInstances"):
        return run_instances_requests(call, launch_templates or {}, principal or {})
    if key in (("ec2", "TerminateInstances"), ("ec2", "ModifyInstanceAttribute")):
        # One request per instance, with the instance's tags (aws:ResourceTag/<key>).
        ids = call.params.get("InstanceIds") or [call.params["InstanceId"]]
        requests = []
        for instance_id in ids:
            instance = _arn(call, "ec2", f"instance/{instance_id}")
            tags = resource_tags(instance) if resource_tags else {}
            context = {**(principal or {}), **{f"aws:ResourceTag/{k}": v for k, v in tags.items()}}
            requests.append(Request(f"ec2:{call.operation}", instance, context))
        return requests
    if key not in OPERATIONS:
        raise Unsupported(f"no IAM mapping for {call.service}:{call.operation}")
    base: dict[str, ContextValue] = dict(principal or {})
    specific: dict[str, ContextValue] = {}
    if call.service == "s3":
        specific = _s3_context(call.params)
    if key == ("sagemaker", "CreateTrainingJob"):
        specific = {**_create_training_job_context(call.params), **_tags(call.params.get("Tags"))}
    requests = [Request(action, arn(call), {**base, **specific}) for action, arn in OPERATIONS[key]]
    if key == ("sagemaker", "AddTags"):
        specific = _tags(call.params.get("Tags"))
        requests = [Request(r.action, r.resource, {**r.context, **specific}) for r in requests]
    tagged = (("sagemaker", "DescribeTrainingJob"), ("sagemaker", "StopTrainingJob"), ("sagemaker", "AddTags"))
    if key in tagged and resource_tags:
        tags = resource_tags(requests[0].resource)
        requests = [Request(r.action, r.resource, {**r.context, **{f"aws:ResourceTag/{k}": v for k, v in tags.items()}})
                    for r in requests]  # fmt: skip
    via = {**base, "kms:ViaService": f"s3.{call.region}.amazonaws.com"}
    writes = ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "CopyObject")
    bucket = call.params.get("Bucket")
    if call.service == "s3" and call.operation in writes and bucket in kms_encrypted_buckets:
        kms_key = call.params.get("SSEKMSKeyId") or kms_encrypted_buckets[bucket]
        requests.append(Request("kms:GenerateDataKey", kms_key, via))
    # Reading an SSE-KMS object decrypts its data key (HeadObject and deletes do not).
    if key == ("s3", "GetObject") and bucket in kms_encrypted_buckets:
        requests.append(Request("kms:Decrypt", kms_encrypted_buckets[bucket], via))
    if key == ("s3", "CopyObject"):
        source_bucket = _s3_copy_source(call).removeprefix("arn:aws:s3:::").split("/", 1)[0]
        if source_bucket in kms_encrypted_buckets:
            requests.append(Request("kms:Decrypt", kms_encrypted_buckets[source_bucket], via))
    if call.service == "application-autoscaling" and call.operation in _AUTOSCALING_ON_BEHALF:
        requests += [Request(action, _on_behalf_resource(call, action), base)
                     for action in _AUTOSCALING_ON_BEHALF[call.operation]]  # fmt: skip
    if key == ("sagemaker-runtime", "InvokeEndpoint") and call.params.get("TargetModel"):
        requests = [Request(r.action, r.resource, {**r.context, "sagemaker:TargetModel": call.params["TargetModel"]})
                    for r in requests]  # fmt: skip
    if key == ("sagemaker", "CreateTrainingJob"):
        requests.append(
            Request("iam:PassRole", call.params["RoleArn"], {**base, "iam:PassedToService": "sagemaker.amazonaws.com"})
        )
        if call.params.get("Tags"):
            # The tagging that comes with a creation names its operation (sagemaker:TaggingAction, Service
            # Authorization Reference, Amazon SageMaker: AddTags); a separate AddTags call has no such key.
            tagging = {**base, **_tags(call.params["Tags"]), "sagemaker:TaggingAction": "CreateTrainingJob"}
            requests.append(Request("sagemaker:AddTags", requests[0].resource, tagging))
    return requests


# Long: one request per resource RunInstances authorizes (instance, volumes, interfaces, subnet, groups, image,
# template, reservation), each with its condition keys
def run_instances_requests(
    call: Call, launch_templates: Mapping[str, Mapping[str, Any]], principal: Mapping[str, ContextValue]
) -> list[Request]:
    """The IAM requests of RunInstances from a launch template, one per resource the launch uses or creates.

    EC2 authorizes RunInstances per resource (EC2 user guide, "Example policies to control the use of RunInstances"
    and "Use launch templates to control launching instances"): the launch template, the instance (ec2:InstanceType),
    each volume and network interface it creates, each subnet and security group, the image (ec2:Owner), the
    placement group; every one with ec2:LaunchTemplate and ec2:IsLaunchTemplateResource; a targeted Capacity
    Reservation (without those keys: they are not modelled for it). Tags at launch need
    ec2:CreateTags with ec2:CreateAction; the instance profile needs iam:PassRole of its role (to ec2.amazonaws.com);
    an image given as ``resolve:ssm:<parameter>`` needs ssm:GetParameters on it; an EBS volume encrypted with a
    customer key needs kms:CreateGrant, kms:GenerateDataKeyWithoutPlaintext, kms:Decrypt and kms:DescribeKey through
    EC2 (EBS user guide, "Amazon EBS encryption": permissions for IAM users).

    ``launch_templates`` maps a template id to ``{"arn", "data" (its LaunchTemplateData, resolved), "image_id",
    "image_owner", "instance_role_arn"}``. A request that overrides template parameters is outside this model.
    """
    params = call.params
    template_id = (params.get("LaunchTemplate") or {}).get("LaunchTemplateId")
    if template_id is None or template_id not in launch_templates:
        raise Unsupported("RunInstances without a launch template the rehearsal knows")
    # UserData and InstanceInitiatedShutdownBehavior override the template without any IAM request or condition key
    # of their own (Service Authorization Reference, Amazon EC2, RunInstances): IAM sees the launch as if they were
    # absent, which is why people may not call RunInstances with the training template at all. Tags given with the
    # call are authorized as ec2:CreateTags with ec2:CreateAction (below).
    invisible = {"UserData", "InstanceInitiatedShutdownBehavior", "TagSpecifications"}
    overrides = set(params) - {"LaunchTemplate", "MinCount", "MaxCount", "ClientToken", "DryRun"} - invisible
    if overrides:
        raise Unsupported(f"RunInstances overriding template parameters: {', '.join(sorted(overrides))}")
    template = launch_templates[template_id]
    data: Mapping[str, Any] = template["data"]
    ec2 = f"arn:aws:ec2:{call.region}:{call.account}"
    base: dict[str, ContextValue] = dict(principal)
    from_template: dict[str, ContextValue] = {
        **base, "ec2:LaunchTemplate": template["arn"], "ec2:IsLaunchTemplateResource": "true"
    }  # fmt: skip
    run = "ec2:RunInstances"
    requests = [
        Request(run, template["arn"], from_template),
        Request(run, f"{ec2}:instance/*", {**from_template, **_instance_keys(data)}),
        Request(run, f"arn:aws:ec2:{call.region}::image/{template['image_id']}",
                {**from_template, "ec2:Owner": template["image_owner"]}),
    ]  # fmt: skip
    requests += [Request(run, f"{ec2}:volume/*", from_template) for _ in data.get("BlockDeviceMappings", [])]
    interfaces = data.get("NetworkInterfaces", [])
    for interface in interfaces:
        requests.append(Request(run, f"{ec2}:network-interface/*", from_template))
        requests.append(Request(run, f"{ec2}:subnet/{interface['SubnetId']}", from_template))
        requests += [Request(run, f"{ec2}:security-group/{group}", from_template) for group in interface["Groups"]]
    if not interfaces:
        raise Unsupported("a launch template without network interfaces")
    if (data.get("Placement") or {}).get("GroupName"):
        requests.append(Request(run, f"{ec2}:placement-group/{data['Placement']['GroupName']}", from_template))
    # A launch into a Capacity Reservation is also authorized on the reservation (Service Authorization Reference,
    # RunInstances resource types); a group's member is chosen by EC2 at launch, unknown to the caller.
    target = (data.get("CapacityReservationSpecification") or {}).get("CapacityReservationTarget") or {}
    if target:
        reservation = target.get("CapacityReservationId") or "*"
        requests.append(Request(run, f"{ec2}:capacity-reservation/{reservation}", base))
    kinds = {"instance": "instance", "volume": "volume", "network-interface": "network-interface"}
    for specification in [*data.get("TagSpecifications", []), *params.get("TagSpecifications", [])]:
        tags = _tags(specification.get("Tags"))
        requests.append(Request("ec2:CreateTags", f"{ec2}:{kinds[specification['ResourceType']]}/*",
                                {**base, **tags, "ec2:CreateAction": "RunInstances"}))  # fmt: skip
    if data.get("IamInstanceProfile"):
        requests.append(
            Request("iam:PassRole", template["instance_role_arn"], {**base, "iam:PassedToService": "ec2.amazonaws.com"})
        )
    image = str(data["ImageId"])
    if image.startswith("resolve:ssm:"):
        parameter = image.removeprefix("resolve:ssm:")
        requests.append(Request("ssm:GetParameters", f"arn:aws:ssm:{call.region}::parameter{parameter}", base))
    via_ec2 = {**base, "kms:ViaService": f"ec2.{call.region}.amazonaws.com"}
    keys = {m["Ebs"]["KmsKeyId"] for m in data.get("BlockDeviceMappings", []) if (m.get("Ebs") or {}).get("KmsKeyId")}
    # EC2 creates the volume's grant for an AWS resource (kms:GrantIsForAWSResource, AWS KMS developer guide,
    # "kms:GrantIsForAWSResource": true when an integrated service creates the grant for the caller).
    for key_arn in sorted(keys):
        requests.append(Request("kms:CreateGrant", key_arn, {**via_ec2, "kms:GrantIsForAWSResource": "true"}))
        requests += [
            Request(action, key_arn, via_ec2)
            for action in ("kms:GenerateDataKeyWithoutPlaintext", "kms:Decrypt", "kms:DescribeKey")
        ]
    return requests
