"""Scheduled handler: terminate every instance of the training launch template that is older than its bound.

A run's own user data powers the instance off after ``training.max_run_hours``, but whoever starts a run may replace
that user data and the shutdown behaviour (IAM has no condition key for either). This bound holds from outside the
instance: an instance launched from the template (EC2's own tag ``aws:ec2launchtemplate:id``, which no caller sets or
removes: the ``aws:`` prefix is reserved) and older than the bound plus a grace period is terminated, termination
protection, which a caller may also set at launch, switched off first.

Runs in Lambda (stdlib + boto3): ec2:DescribeInstances (no resource-level permissions), and ec2:ModifyInstanceAttribute
and ec2:TerminateInstances only on instances carrying the template's tag (the policy's condition).
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)
TEMPLATE_TAG = "aws:ec2launchtemplate:id"
LIVE_STATES = ["pending", "running", "stopping", "stopped"]
# Each call is bounded (botocore's defaults: 60 s to connect, 60 s to read, retried), so that within the function's
# timeout a sweep finds the overdue instances and ends a protected one (four calls) even when the API is slow: the sweep
# then fails with the API's error, not cut off by Lambda, and the next sweep goes on where it stopped. No retry: the
# next sweep is the retry (the schedule's target makes none either).
CLIENT_LIMITS = Config(connect_timeout=3, read_timeout=8, retries={"mode": "standard", "total_max_attempts": 1})


def overdue(ec2: Any, template_id: str, bound: datetime.timedelta, now: datetime.datetime) -> list[str]:
    """The instances of ``template_id`` launched more than ``bound`` before ``now`` and not yet terminated."""
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{TEMPLATE_TAG}", "Values": [template_id]},
            {"Name": "instance-state-name", "Values": LIVE_STATES},
        ]
    )
    return sorted(
        instance["InstanceId"]
        for page in pages
        for reservation in page["Reservations"]
        for instance in reservation["Instances"]
        if now - instance["LaunchTime"] > bound
    )


def terminate(ec2: Any, instance_ids: list[str]) -> list[str]:
    """Terminate ``instance_ids``; one with termination protection is unprotected first. Returns those terminated."""
    done = []
    for instance_id in instance_ids:
        try:
            ec2.terminate_instances(InstanceIds=[instance_id])
        except ClientError as error:
            if error.response["Error"]["Code"] != "OperationNotPermitted":
                raise
            ec2.modify_instance_attribute(InstanceId=instance_id, DisableApiTermination={"Value": False})
            ec2.terminate_instances(InstanceIds=[instance_id])
        done.append(instance_id)
    return done


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """``event``: the schedule's input, ``{"launch_template_id", "max_run_hours", "grace_minutes"}``."""
    template_id = str(event["launch_template_id"])
    bound = datetime.timedelta(hours=int(event["max_run_hours"]), minutes=int(event["grace_minutes"]))
    ec2 = boto3.client("ec2", config=CLIENT_LIMITS)
    found = overdue(ec2, template_id, bound, datetime.datetime.now(datetime.UTC))
    terminated = terminate(ec2, found)
    for instance_id in terminated:
        LOG.info("terminated %s: launched from %s more than %s ago", instance_id, template_id, bound)
    return {"terminated": terminated}
