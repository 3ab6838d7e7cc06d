"""The platform-owned launcher of EC2 training runs: a function that starts runs from the training launch template
with validated inputs (stacks/components/run_launcher/handler.py), the only holder of the template's launch grant.

Why a Lambda function: RunInstances from a template is the only call a run needs, and a function checks its inputs in
code (run name, node count, instance type of the allowed set, training arguments as bounded numbers) before it makes
it; the same handler runs against moto in the tests. A Step Functions state machine would make the same one call with
its checks written as Choice states that no emulator here runs, and an SSM Automation document's aws:runInstances
step takes user data as a parameter of the document, which is what people must not choose. People and CI get
``lambda:InvokeFunction`` on this function only (``grant_invoke``), never ec2:RunInstances or iam:PassRole.
"""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from stacks.compliance import acknowledge, acknowledge_control
from stacks.components.iam_statements import reasoned_policy
from stacks.components.stack_function import function_logs_and_role, write_own_logs
from stacks.components.training_instance_role import TrainingInstanceRole
from stacks.components.training_launch_template import TrainingLaunchTemplate

HANDLER = Path(__file__).with_name("run_launcher")


class TrainingLauncher(Construct):
    """``function`` starts runs of ``template`` (1 to ``max_nodes`` instances of its type); ``grant_invoke`` lets a
    principal ask it to."""

    # Long: one function with its log group, role, launch policy and settings, declared in dependency order, each
    # acknowledgement next to the resource it excuses.
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        template: TrainingLaunchTemplate,
        max_nodes: int,
        instances: TrainingInstanceRole,
        key: kms.IKey,
        log_retention_days: int,
        removal_policy: cdk.RemovalPolicy,
        retention_setting: str,
    ) -> None:
        super().__init__(scope, construct_id)
        log_group, self.role = function_logs_and_role(
            self,
            key=key,
            log_retention_days=log_retention_days,
            removal_policy=removal_policy,
            role_description="Starts EC2 training runs from the training launch template, from validated inputs",
            retention_setting=retention_setting,
        )
        # "LaunchPolicy": apart from the stack's TrainingLauncherPolicy (the people's) by more than a hash.
        self.policy = reasoned_policy(
            self,
            "LaunchPolicy",
            "Start training runs from the template",
            [(write_own_logs(log_group), None)],
            roles=[self.role],
        )
        # RunInstances, PassRole of the instance role, the volume key: only from the template, on this role only.
        template.grant_launch(self.policy)
        # Recording a launch (the Foundation's policy, beside the bucket and the instance role whose folders it names).
        self.role.add_managed_policy(instances.launch_record_policy)
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="handler.handler",
            code=lambda_.Code.from_asset(str(HANDLER), exclude=["__init__.py", "__pycache__", "*.pyc"]),
            timeout=cdk.Duration.seconds(30),
            memory_size=128,
            role=self.role,
            log_group=log_group,
            # Identifiers and numbers only (no secret): Lambda encrypts them at rest with its own key.
            environment={
                "LAUNCH_TEMPLATE_ID": template.launch_template_id,
                "LAUNCH_TEMPLATE_VERSION": template.launch_template.latest_version_number,
                "INSTANCE_TYPES": template.instance_type,
                "MAX_NODES": str(max_nodes),
                "ARTIFACTS_BUCKET": instances.artifacts.bucket_name,
                "OUTPUT_PREFIX": instances.output_prefix,
                "KMS_KEY_ID": key.key_arn,
                # The writers' folders are the instances' sessions, <role id>:<instance id> (run_lineage.py).
                "INSTANCE_ROLE_ID": instances.role.role_id,
            },
            # A few launches a day: one at a time is plenty and bounds what a stuck caller can start at once.
            reserved_concurrent_executions=1,
            description="Starts EC2 training runs from the training launch template, from validated inputs",
        )
        cfn_function = self.function.node.default_child
        assert isinstance(cfn_function, lambda_.CfnFunction)
        # The function may not run before its permissions exist; CDK orders it after its role (cfn-lint W3005).
        policy = self.policy.node.default_child
        assert isinstance(policy, iam.CfnManagedPolicy)
        cfn_function.add_override("DependsOn", [cdk.Stack.of(self).get_logical_id(policy)])
        # checkov reads its exceptions from the resource's template metadata.
        cfn_function.add_metadata("checkov", {"skip": [{"id": "CKV_AWS_173", "comment": (
            "The environment holds the launch template's id and version, the instance type, a node count, the "
            "bucket's name, the key's ARN and the instance role's id: no secret. Lambda encrypts it at rest with "
            "its own key; the platform key serves only the services its policy names, Lambda not among "
            "them.")}, {"id": "CKV_AWS_45", "comment": (
            "The same identifiers and numbers: no secret. What checkov 3 flags is its own record of the template's "
            "file name, which it adds to the variables (Properties/Environment/Variables/__file__) and whose "
            "generated stack name can read as a high-entropy string (the pipeline's dev stage).")}]})  # fmt: skip
        outside_vpc = (
            "It calls the EC2 API, which the platform's VPC has no interface endpoint for (docs/security.md, the NAT "
            "table), and writes one small launch record per launch (instance ids); it reads no data."
        )
        acknowledge(
            self.function,
            f"{outside_vpc} The caller invokes it synchronously and gets its answer or refusal: a dead-letter queue "
            "would hold nothing to retry.",
            "NIST.800.53.R5-LambdaInsideVPC",
            "NIST.800.53.R5-LambdaDLQ",
        )
        acknowledge_control(self.function, outside_vpc, "lambda_inside_vpc_check")

    def grant_invoke(self, policy: iam.ManagedPolicy) -> None:
        """Let the holders of ``policy`` start runs through the launcher, and nothing else."""
        policy.add_statements(
            iam.PolicyStatement(
                sid="StartTrainingRunsThroughTheLauncher",
                actions=["lambda:InvokeFunction"],
                resources=[self.function.function_arn],
            )
        )
