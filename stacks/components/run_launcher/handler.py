"""The platform's training launcher: starts an EC2 training run from the training launch template, from validated
inputs only.

Whoever may call RunInstances with a launch template may also replace its user data and its instance-initiated
shutdown behaviour (IAM has no condition key for either: Service Authorization Reference, Amazon EC2, RunInstances),
so people never call it: they invoke this function, which takes a run name, a node count, an instance type of the
allowed set and training arguments as data (a table of flags, each a number within bounds), and calls RunInstances
with the template's own user data, shutdown behaviour, network and profile, overriding nothing but the count and the
instance tags that name the run (``training-run-id``) and carry its arguments (``training-run-args``), which
ec2_run.sh reads. Anything else in the request (user data, another template, a shutdown behaviour, a key pair, an
unknown argument) is refused with one sentence.

Once the instances exist, it records the launch: ``<OUTPUT_PREFIX><run>/launches/<reservation id>.json`` in the
artifacts bucket, ``{"run_id", "reservation_id", "writers"}``, the writers being each instance's session id
(``<instance role id>:<instance id>``, the folder of the run that instance alone may write). Only this function writes
under ``launches/``, so a run's records say which instances' folders are the run's: ec2_run.sh waits for its own
launch's record before it trains, resumes only from the folders its run's records name, and a candidate is the run's
only in such a folder (training_assets/instance/run_lineage.py). Written once (If-None-Match: *), SSE-KMS with the
platform key.

Runs in Lambda (stdlib + boto3). Its settings come from its environment: LAUNCH_TEMPLATE_ID, LAUNCH_TEMPLATE_VERSION,
INSTANCE_TYPES (comma-separated: the allowed set, the template's own type first), MAX_NODES, ARTIFACTS_BUCKET,
OUTPUT_PREFIX, KMS_KEY_ID, INSTANCE_ROLE_ID. The instance type is checked, never overridden: the allowed set is the
template's type, which the launch grant also requires.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)
RUN_ID_TAG = "training-run-id"
RUN_ARGS_TAG = "training-run-args"
# A run name becomes an S3 prefix, a rendezvous id and a tag value: ec2_run.sh's own rule, a little narrower.
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
REQUEST_KEYS = frozenset({"run_name", "nodes", "instance_type", "arguments"})
# Each call is bounded (botocore's defaults: 60 s to connect, 60 s to read, retried), so that a launch (RunInstances,
# then its record) ends within the function's timeout even when the API is slow: the caller then gets the API's error
# instead of Lambda's timeout in the middle of a launch. No retry: the caller, who sees the error, is the retry.
CLIENT_LIMITS = Config(connect_timeout=3, read_timeout=8, retries={"mode": "standard", "total_max_attempts": 1})


@dataclass(frozen=True)
class Argument:
    """One train_sentiment.py flag a launch may set: its number type and inclusive bounds."""

    flag: str
    kind: type[int] | type[float]
    low: float
    high: float


ARGUMENTS: Mapping[str, Argument] = {
    "epochs": Argument("--epochs", int, 1, 100),
    "learning_rate": Argument("--learning-rate", float, 1e-8, 1.0),
    "per_device_batch_size": Argument("--per-device-batch-size", int, 1, 1024),
    "seed": Argument("--seed", int, 0, 2**31 - 1),
}


class Refused(ValueError):
    """The request is not a run this launcher starts; the message is the one sentence the caller sees."""


@dataclass(frozen=True)
class Settings:
    template_id: str
    template_version: str
    instance_types: tuple[str, ...]
    max_nodes: int
    artifacts_bucket: str
    output_prefix: str
    kms_key_id: str
    instance_role_id: str

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Settings:
        return cls(
            environ["LAUNCH_TEMPLATE_ID"],
            environ["LAUNCH_TEMPLATE_VERSION"],
            tuple(environ["INSTANCE_TYPES"].split(",")),
            int(environ["MAX_NODES"]),
            environ["ARTIFACTS_BUCKET"],
            environ["OUTPUT_PREFIX"],
            environ["KMS_KEY_ID"],
            environ["INSTANCE_ROLE_ID"],
        )


def _number(name: str, value: Any, argument: Argument) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Refused(f"arguments.{name} must be a number, got {value!r}.")
    if argument.kind is int and not (isinstance(value, int) or float(value).is_integer()):
        raise Refused(f"arguments.{name} must be a whole number, got {value!r}.")
    if not math.isfinite(value) or not argument.low <= value <= argument.high:
        raise Refused(f"arguments.{name} must be between {argument.low:g} and {argument.high:g}, got {value!r}.")
    return str(int(value)) if argument.kind is int else repr(float(value))


def run_arguments(arguments: Any) -> str:
    """The ``--flag number`` pairs of ``arguments`` (a mapping of ARGUMENTS' names to numbers), in a fixed order."""
    if not isinstance(arguments, dict):
        raise Refused("arguments must be an object of training arguments.")
    unknown = sorted(set(arguments) - set(ARGUMENTS))
    if unknown:
        raise Refused(f"arguments {', '.join(unknown)} are not training arguments a launch may set; "
                      f"allowed: {', '.join(ARGUMENTS)}.")  # fmt: skip
    return " ".join(
        f"{ARGUMENTS[name].flag} {_number(name, arguments[name], ARGUMENTS[name])}"
        for name in ARGUMENTS
        if name in arguments
    )


def launch_request(event: Any, settings: Settings) -> dict[str, Any]:
    """The RunInstances parameters for ``event``, or Refused with the sentence that says why not."""
    if not isinstance(event, dict):
        raise Refused("The request must be an object with run_name, nodes, instance_type and arguments.")
    other = sorted(set(event) - REQUEST_KEYS)
    if other:
        raise Refused(f"{', '.join(other)}: a launch takes only {', '.join(sorted(REQUEST_KEYS))}; user data, "
                      "templates, shutdown behaviour and network are the platform's.")  # fmt: skip
    run_name = event.get("run_name")
    if not isinstance(run_name, str) or not RUN_NAME.fullmatch(run_name):
        raise Refused(f"run_name must be 1-64 letters, digits, '.', '_' or '-' starting with a letter or digit, "
                      f"got {run_name!r}.")  # fmt: skip
    nodes = event.get("nodes", 1)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= settings.max_nodes:
        raise Refused(f"nodes must be a whole number from 1 to {settings.max_nodes}, got {nodes!r}.")
    instance_type = event.get("instance_type", settings.instance_types[0])
    if instance_type not in settings.instance_types:
        raise Refused(f"instance_type must be one of {', '.join(settings.instance_types)}, got {instance_type!r}.")
    tags = [{"Key": RUN_ID_TAG, "Value": run_name}]
    arguments = run_arguments(event.get("arguments", {}))
    if arguments:
        tags.append({"Key": RUN_ARGS_TAG, "Value": arguments})
    return {
        "LaunchTemplate": {"LaunchTemplateId": settings.template_id, "Version": settings.template_version},
        "MinCount": nodes,
        "MaxCount": nodes,
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
    }


def launch(ec2: Any, s3: Any, event: Any, settings: Settings) -> dict[str, Any]:
    """Start the run ``event`` asks for and record which instances make it up; what the caller needs to follow it."""
    reservation = ec2.run_instances(**launch_request(event, settings))
    started = {
        "run_id": event["run_name"],
        "reservation_id": reservation["ReservationId"],
        "instance_ids": [instance["InstanceId"] for instance in reservation["Instances"]],
    }
    started["launch_record"] = record(s3, started["run_id"], started["reservation_id"], started["instance_ids"],
                                      settings)  # fmt: skip
    return started


def record(s3: Any, run_id: str, reservation_id: str, instance_ids: list[str], settings: Settings) -> str:
    """Write the record of one launch (once, SSE-KMS): which instances' folders are the run's; its URI. The layout
    is training_assets/instance/run_lineage.py's (the function's code asset holds this folder only)."""
    writers = [f"{settings.instance_role_id}:{instance}" for instance in instance_ids]
    body = json.dumps({"run_id": run_id, "reservation_id": reservation_id, "writers": writers}).encode()
    key = f"{settings.output_prefix}{run_id}/launches/{reservation_id}.json"
    s3.put_object(Bucket=settings.artifacts_bucket, Key=key, Body=body, IfNoneMatch="*",
                  ServerSideEncryption="aws:kms", SSEKMSKeyId=settings.kms_key_id,
                  ContentType="application/json")  # fmt: skip
    return f"s3://{settings.artifacts_bucket}/{key}"


def handler(event: Any, _context: Any) -> dict[str, Any]:
    """Lambda entry point: the launched run; a refused request fails the invocation with its sentence (Refused)."""
    ec2, s3 = boto3.client("ec2", config=CLIENT_LIMITS), boto3.client("s3", config=CLIENT_LIMITS)
    started = launch(ec2, s3, event, Settings.from_environment(os.environ))
    LOG.info("started run %s: %s", started["run_id"], started)
    return started
