"""The rehearsal's aws call server (proving_ground/rehearsal/aws_calls.py ``serve``, the ``aws`` shim of
proving_ground/rehearsal/ec2_host.py): a call
forked from it behaves as the gated CLI in a process of its own: the caller's streams, exit codes and credentials,
every call through the gate; and with the server gone the shim runs that process itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from proving_ground.rehearsal.aws_calls import GATE_ENV, Gate, Principal, start_server
from proving_ground.rehearsal.ec2_host import install_host_tools, shared_aws_cli

ACCOUNT = "123456789012"
# A principal recorded only, and one whose policy allows one S3 read and nothing else.
OPERATOR = Principal("operator", "AKIAOPERATOR0000", None, {"aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/op"})
READER = Principal(
    "reader",
    "AKIAREADER000000",
    [{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]}],
    {"aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/reader"},
)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Gate, dict[str, str]]]:
    """(bin folder, the server's socket, the gate, the environment of a caller); the server stopped afterwards."""
    work = tmp_path_factory.mktemp("aws-call-server")
    aws_cli = shared_aws_cli()
    gate = Gate(ACCOUNT, "us-west-2", work / "calls.jsonl", [OPERATOR, READER])
    gate.save(work / "gate.json")
    socket = Path(tempfile.mkdtemp(prefix="aws-test-")) / "aws.sock"  # a socket path has 107 bytes at most
    bin_dir = install_host_tools(work / "bin", aws_cli, gated=True, aws_server=socket)
    environment = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(work), GATE_ENV: str(work / "gate.json"),
                   "AWS_DEFAULT_REGION": "us-west-2", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                   "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                   "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1"}  # fmt: skip
    stop = start_server(socket, aws_cli, environment, work / "server.log", services=("sts", "ec2"))
    try:
        yield bin_dir, socket, gate, environment
    finally:
        stop()
        socket.parent.rmdir()


def _bash(script: str, environment: dict[str, str], principal: Principal, cwd: Path | None = None) -> Any:
    return subprocess.run(["bash", "-c", script], env={**environment, **principal.environment()}, cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_a_call_answers_through_the_callers_pipe_as_its_principal(host: tuple, tmp_path: Path) -> None:
    _, socket, gate, environment = host
    assert socket.exists()
    # The pipe ends when the call ends: the server keeps no copy of the caller's streams.
    done = _bash("aws sts get-caller-identity --output json | cat > identity.json && echo done", environment, OPERATOR,
                 cwd=tmp_path)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "done\n"), done.stderr
    assert json.loads((tmp_path / "identity.json").read_text())["Arn"] == f"arn:aws:iam::{ACCOUNT}:role/op"
    assert [(r.principal, r.operation) for r in gate.records()][-1] == ("operator", "GetCallerIdentity")


def test_a_refused_call_exits_as_the_cli_does_and_the_gate_records_it(host: tuple) -> None:
    _, _, gate, environment = host
    refused = _bash("aws ec2 describe-instances", environment, READER)
    assert refused.returncode == 255, refused.stderr  # the CLI v1's exit code for a service error
    assert "AccessDenied" in refused.stderr and "ec2:DescribeInstances" in refused.stderr
    last = gate.records()[-1]
    assert (last.principal, last.operation, last.allowed) == ("reader", "DescribeInstances", False)


def test_without_the_server_the_shim_runs_the_cli_itself_with_the_same_answer(host: tuple) -> None:
    bin_dir, socket, _, environment = host
    served = _bash("aws sts no-such-operation", environment, OPERATOR)
    # The same shim pointed at a socket where no server listens.
    alone = bin_dir.parent / "bin-alone"
    alone.mkdir(exist_ok=True)
    shim = (bin_dir / "aws").read_text().replace(repr(str(socket)), repr(str(socket.with_name("gone.sock"))))
    (alone / "aws").write_text(shim)
    (alone / "aws").chmod(0o755)
    by_itself = _bash("aws sts no-such-operation", {**environment, "PATH": f"{alone}:/usr/bin:/bin"}, OPERATOR)
    assert served.returncode == by_itself.returncode == 2  # argparse's usage error
    assert served.stderr == by_itself.stderr and "Invalid choice" in served.stderr


# Starts a server and ends without stopping it (as a killed process would), printing the server's pid.
_STARTER = """
import os, sys
from pathlib import Path
import psutil
from proving_ground.rehearsal.aws_calls import start_server
socket = Path(sys.argv[1])
start_server(socket, Path(sys.argv[2]), dict(os.environ), socket.with_name("server.log"))
print(psutil.Process().children()[0].pid, flush=True)
os._exit(0)
"""


def test_a_server_whose_starter_is_gone_stops_by_itself() -> None:
    socket = Path(tempfile.mkdtemp(prefix="aws-test-")) / "aws.sock"
    try:
        started = subprocess.run([sys.executable, "-c", _STARTER, str(socket), str(shared_aws_cli())],
                                 env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                                 capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
        pid = int(started.stdout)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.1)
        else:
            psutil.Process(pid).kill()
            raise AssertionError(
                f"the server outlived its starter by 60 s: {(socket.parent / 'server.log').read_text()}"
            )
    finally:
        shutil.rmtree(socket.parent, ignore_errors=True)
