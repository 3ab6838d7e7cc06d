"""The outside bound of EC2 training runs: a scheduled function that terminates every instance of the training launch
template older than ``training.max_run_hours`` plus a grace period, whatever the instance's own user data or shutdown
behaviour say (stacks/components/run_reaper/handler.py)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import aws_cdk as cdk
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from stacks.compliance import acknowledge, acknowledge_control
from stacks.components.iam_statements import ReasonedStatement, arn, reasoned_policy
from stacks.components.stack_function import function_logs_and_role, write_own_logs

HANDLER = Path(__file__).with_name("run_reaper")
# Past the bound, the instance's own shutdown (user data: `shutdown -h +<max_run_hours x 60>`) has had time to act.
GRACE_MINUTES = 30
SWEEP_MINUTES = 15


class TrainingRunReaper(Construct):
    """Every ``SWEEP_MINUTES``, terminate the instances of ``launch_template_id`` launched more than
    ``max_run_hours`` hours and ``GRACE_MINUTES`` ago."""

    # Long: one scheduled function with its log group, role, scoped policy and rule, declared in dependency order, each
    # acknowledgement next to the resource it excuses.
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        launch_template_id: str,
        max_run_hours: int,
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
            role_description="Terminates training instances older than training.max_run_hours",
            retention_setting=retention_setting,
        )
        self.policy = reasoned_policy(
            self,
            "Policy",
            "Find the training launch template's instances; terminate only those",
            [(write_own_logs(log_group), None), *_reaper_statements(self, launch_template_id)],
            roles=[self.role],
        )
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="handler.handler",
            code=lambda_.Code.from_asset(str(HANDLER), exclude=["__init__.py", "__pycache__", "*.pyc"]),
            timeout=cdk.Duration.minutes(1),
            memory_size=128,
            role=self.role,
            log_group=log_group,
            # One sweep at a time: a second would find the same instances.
            reserved_concurrent_executions=1,
            description="Terminates training instances older than training.max_run_hours (the outside bound)",
        )
        # The function may not run before its permissions exist; CDK already orders it after its role (cfn-lint
        # W3005), so only the policy is named.
        cast(lambda_.CfnFunction, self.function.node.default_child).add_override(
            "DependsOn", [cdk.Stack.of(self).get_logical_id(cast(iam.CfnManagedPolicy, self.policy.node.default_child))]
        )
        outside_vpc = (
            "It calls only the EC2 API, which the platform's VPC has no interface endpoint for (docs/security.md, "
            "the NAT table); it reads and holds no data."
        )
        acknowledge(
            self.function,
            f"{outside_vpc} A failed sweep is repeated by the next one {SWEEP_MINUTES} minutes later: a dead-letter "
            "queue would hold nothing to retry.",
            "NIST.800.53.R5-LambdaInsideVPC",
            "NIST.800.53.R5-LambdaDLQ",
        )
        acknowledge_control(self.function, outside_vpc, "lambda_inside_vpc_check")
        self.schedule = events.Rule(
            self,
            "Schedule",
            description="Sweep for training instances past training.max_run_hours",
            schedule=events.Schedule.rate(cdk.Duration.minutes(SWEEP_MINUTES)),
            # What to sweep travels in the event, not in environment variables (which would want a KMS key of their
            # own: the platform key serves only the services its policy names).
            targets=[
                targets.LambdaFunction(
                    self.function,
                    retry_attempts=0,
                    event=events.RuleTargetInput.from_object(
                        {
                            "launch_template_id": launch_template_id,
                            "max_run_hours": max_run_hours,
                            "grace_minutes": GRACE_MINUTES,
                        }
                    ),
                )
            ],
        )


def _reaper_statements(scope: Construct, launch_template_id: str) -> list[ReasonedStatement]:
    """DescribeInstances (no resource-level permissions), and the two instance actions only on instances whose
    EC2-set tag names the training launch template (aws:ResourceTag, a condition key of the instance resource type
    of both actions, Service Authorization Reference, Amazon EC2)."""
    return [
        (
            iam.PolicyStatement(sid="FindInstances", actions=["ec2:DescribeInstances"], resources=["*"]),
            "ec2:DescribeInstances has no resource-level permissions.",
        ),
        (
            iam.PolicyStatement(
                sid="TerminateOnlyTrainingInstances",
                actions=["ec2:TerminateInstances", "ec2:ModifyInstanceAttribute"],
                resources=[arn(scope, "ec2", "instance/*")],
                conditions={"StringEquals": {"aws:ResourceTag/aws:ec2launchtemplate:id": launch_template_id}},
            ),
            "Instance ids are generated at launch; EC2's own aws:ec2launchtemplate:id tag limits these to the "
            "training launch template's instances.",
        ),
    ]
