"""Retention for the log group SageMaker writes every training job to, which the account owns and a stack must not."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.compliance import acknowledge_control
from stacks.components.iam_statements import arn, reasoned_policy

# The construct id suffix CDK gives its singleton LogRetention function (aws-logs/lib/log-retention.ts).
LOG_RETENTION_ID = "aae0aa3c5b4d4f87b02d85b201efdd8a"


class TrainingJobLogRetention(Construct):
    """Sets the retention of ``log_group_name`` (/aws/sagemaker/TrainingJobs) with CDK's LogRetention custom
    resource (this construct's default child), run by its own role (``role``, ``policy``) that may touch that group
    and its own logs only.

    The group belongs to the account, not to an environment: SageMaker creates it with the first training job of
    the account and region and writes every job into it (the name cannot be chosen), so a stack must not own it. As
    an AWS::Logs::LogGroup, CloudFormation would fail to create it wherever a job ran before, and deleting the stack
    would delete every team's training logs. The LogRetention custom resource instead creates the group if it is
    missing and sets its retention; the group stays when the stack goes. No platform key: one environment's key
    (dev's is deleted with dev) would decide whether every job in the account can log.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, log_group_name: str, retention: logs.RetentionDays
    ) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        lambda_service = iam.ServicePrincipal("lambda.amazonaws.com")
        self.role = iam.Role(
            self, "Role", assumed_by=lambda_service, description=f"Sets the retention of {log_group_name}"
        )
        handler_logs = arn(self, "logs", f"log-group:/aws/lambda/{stack.stack_name}-LogRetention*")
        self.policy = reasoned_policy(
            self,
            "Policy",
            f"Sets the retention of {log_group_name} only",
            [
                (
                    iam.PolicyStatement(
                        sid="SetTheRetentionOfTheTrainingJobLogGroup",
                        actions=["logs:CreateLogGroup", "logs:PutRetentionPolicy", "logs:DeleteRetentionPolicy"],
                        resources=[arn(self, "logs", f"log-group:{log_group_name}:*")],
                    ),
                    "IAM checks these group-level actions against the group's ARN ending in ':*' (CloudWatch Logs "
                    "API reference, LogGroup.arn); the statement names one log group and holds no stream action.",
                ),
                (
                    iam.PolicyStatement(
                        sid="WriteOwnLogs",
                        # On Create the handler also creates its own group and gives it a 1-day retention (aws-cdk
                        # custom-resource-handlers/lib/aws-logs/log-retention-handler/index.ts).
                        actions=[
                            "logs:CreateLogGroup",
                            "logs:CreateLogStream",
                            "logs:PutLogEvents",
                            "logs:PutRetentionPolicy",
                        ],
                        resources=[handler_logs, f"{handler_logs}:log-stream:*"],
                    ),
                    "The handler's own log group is named after the function name CloudFormation generates.",
                ),
            ],
            roles=[self.role],
        )
        retention_resource = logs.LogRetention(
            self,
            "Default",
            log_group_name=log_group_name,
            retention=retention,
            removal_policy=cdk.RemovalPolicy.RETAIN,
            # Immutable: CDK would otherwise add logs:PutRetentionPolicy on * to the role.
            role=self.role.without_policy_updates(),
        )
        # The handler is CDK's singleton function of the stack, shared by every LogRetention in it.
        acknowledge_control(
            stack.node.find_child(f"LogRetention{LOG_RETENTION_ID}"),
            "CDK's singleton LogRetention handler has no VPC option; it runs once per deployment and calls only "
            "CloudWatch Logs.",
            "lambda_inside_vpc_check",
        )
        retention_resource.node.add_dependency(self.policy)  # the handler runs with these permissions
