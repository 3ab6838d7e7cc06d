"""AWS as the training instance's host sees it in the tests: the region and the credentials of the host's AWS CLI,
which talks to a moto server (the ``aws_cli`` and ``moto_endpoint`` fixtures of this folder's conftest)."""

from __future__ import annotations

from typing import Any

import boto3

REGION = "us-west-2"
HOST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def host_client(service: str, endpoint: str) -> Any:
    """A boto3 client of ``service`` at the moto server ``endpoint``, with the host's credentials."""
    return boto3.client(
        service,
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id=HOST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=HOST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
