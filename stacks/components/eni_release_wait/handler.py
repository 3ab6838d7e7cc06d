"""Custom-resource handler: on Delete, wait until SageMaker has released the network interfaces in a security group.

SageMaker deletes an endpoint's VPC network interfaces asynchronously, minutes after DeleteEndpoint returns, and
CloudFormation does not wait for them (cloudformation-coverage-roadmap issue 1327): deleting the VPC's stack right
after fails with DependencyViolation on the security group and subnets. Each endpoint stack holds this resource, and
its model depends on it, so CloudFormation deletes the endpoint, its config and its model first and this wait last.

Runs in Lambda (stdlib + boto3); Create and Update do nothing. The wait is bounded by the Lambda's remaining time and
fails with one clear sentence on time-out, naming the interfaces that remain.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

import boto3
from botocore.exceptions import ClientError

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)
POLL_SECONDS = 15
# Time kept back from the Lambda's limit to answer CloudFormation (an unanswered request hangs the stack).
RESPONSE_MARGIN_SECONDS = 30
PHYSICAL_ID = "eni-release-wait"


class StillInUse(Exception):
    """Network interfaces remained past the deadline; the message is the sentence CloudFormation shows."""


def live_endpoints(sagemaker: Any, names: Sequence[str]) -> list[str]:
    """Which of ``names`` exist and are not being deleted: endpoints that still hold interfaces in the group."""
    live = []
    for name in names:
        try:
            status = sagemaker.describe_endpoint(EndpointName=name)["EndpointStatus"]
        except ClientError as error:
            if error.response["Error"]["Code"] == "ValidationException":  # "Could not find endpoint"
                continue
            raise
        if status != "Deleting":
            live.append(name)
    return live


def interfaces(ec2: Any, group_ids: Sequence[str]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for page in ec2.get_paginator("describe_network_interfaces").paginate(
        Filters=[{"Name": "group-id", "Values": list(group_ids)}]
    ):
        found.extend(page["NetworkInterfaces"])
    return found


def wait_for_release(
    ec2: Any,
    sagemaker: Any,
    group_ids: Sequence[str],
    shared_with: Sequence[str],
    *,
    budget_seconds: float,
    poll_seconds: float = POLL_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Return once no network interface of ``group_ids`` remains (a sentence saying so), or raise StillInUse after
    ``budget_seconds``. Another live endpoint in ``shared_with`` keeps its interfaces in the same group: then there
    is nothing to wait for here, and that endpoint's stack waits when it is deleted."""
    groups = ", ".join(group_ids)
    live = live_endpoints(sagemaker, shared_with)
    if live:
        return f"Not waiting: endpoint {', '.join(live)} still uses {groups}; its stack waits when it is deleted."
    start = clock()
    while True:
        remaining = interfaces(ec2, group_ids)
        elapsed = clock() - start
        if not remaining:
            return f"No network interface of {groups} remains (waited {elapsed:.0f} s)."
        if elapsed + poll_seconds > budget_seconds:
            listed = "; ".join(
                f"{eni['NetworkInterfaceId']} ({eni.get('Status', '?')}, {eni.get('Description') or 'no description'})"
                for eni in remaining[:5]
            )
            raise StillInUse(
                f"{len(remaining)} network interface(s) of {groups} remain after {elapsed / 60:.0f} minutes: "
                f"{listed}; SageMaker releases an endpoint's interfaces some minutes after deleting it, so run the "
                "deletion again later (anything else still in the group, such as a training instance, must go first)."
            )
        LOG.info("%d network interface(s) of %s remain; checking again in %s s", len(remaining), groups, poll_seconds)
        sleep(poll_seconds)


def respond(event: dict[str, Any], status: str, reason: str) -> None:
    """Answer CloudFormation on the pre-signed S3 URL (cfn-response protocol)."""
    body = json.dumps(
        {
            "Status": status,
            "Reason": reason[:3500],
            "PhysicalResourceId": event.get("PhysicalResourceId", PHYSICAL_ID),
            "StackId": event["StackId"],
            "RequestId": event["RequestId"],
            "LogicalResourceId": event["LogicalResourceId"],
        }
    ).encode()
    request = urllib.request.Request(
        event["ResponseURL"], data=body, method="PUT", headers={"Content-Type": "", "Content-Length": str(len(body))}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        LOG.info("CloudFormation answered %s", response.status)


def handler(event: dict[str, Any], context: Any, *, ec2: Any = None, sagemaker: Any = None) -> None:
    status, reason = "SUCCESS", f"{event['RequestType']}: nothing to do."
    try:
        if event["RequestType"] == "Delete":
            properties = event["ResourceProperties"]
            reason = wait_for_release(
                ec2 or boto3.client("ec2"),
                sagemaker or boto3.client("sagemaker"),
                properties["SecurityGroupIds"],
                properties.get("SharedWithEndpoints", []),
                budget_seconds=context.get_remaining_time_in_millis() / 1000 - RESPONSE_MARGIN_SECONDS,
            )
    except Exception as error:  # CloudFormation must always get an answer
        LOG.exception("wait failed")
        status, reason = "FAILED", str(error)
    LOG.info("%s: %s", status, reason)
    respond(event, status, reason)
