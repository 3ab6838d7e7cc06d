"""AWS as the training instance's host sees it in the tests: the region and the credentials of the host's AWS CLI,
which talks to a moto server (the ``aws_cli`` and ``moto_endpoint`` fixtures of this folder's conftest), and the
host's tools around it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3

from proving_ground.rehearsal.aws_calls import GATE_ENV, Gate, Principal, start_server
from proving_ground.rehearsal.ec2_host import install_host_tools

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


@contextmanager
def host_tools(aws_cli: Path, endpoint: str, work: Path) -> Iterator[tuple[Path, dict[str, str], Gate]]:
    """The host's shims (proving_ground/rehearsal/ec2_host.py) in ``work``/bin, its ``aws`` calls forked from one call
    server that
    imported the CLI once (proving_ground/rehearsal/aws_calls.py, as the rehearsal's hosts run theirs: a new Python
    importing the CLI
    spent ~0.9 CPU-s per call). Yields the bin folder, what a caller's environment needs (the PATH, the gate's file,
    the moto endpoint and the host's credentials), and the gate: it records the host's calls without checking them
    (these tests are about what the host does; the rehearsal checks its permissions). The server stops afterwards."""
    host = Principal("host", HOST_CREDENTIALS["AWS_ACCESS_KEY_ID"], policies=None)
    gate = Gate("123456789012", REGION, work / "calls.jsonl", [host])
    server = Path(tempfile.mkdtemp(prefix="aws-")) / "aws.sock"  # a socket path has 107 bytes at most
    bin_dir = install_host_tools(work / "bin", aws_cli, gated=True, aws_server=server)
    environment = {"PATH": f"{bin_dir}:/usr/bin:/bin", GATE_ENV: str(gate.save(work / "gate.json")),
                   "AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": REGION, "AWS_CONFIG_FILE": "/nonexistent",
                   "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", **HOST_CREDENTIALS}  # fmt: skip
    stop = start_server(server, aws_cli, environment, work / "server.log", services=("s3",))
    try:
        yield bin_dir, environment, gate
    finally:
        stop()
        shutil.rmtree(server.parent, ignore_errors=True)
