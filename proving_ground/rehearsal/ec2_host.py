"""A GPU training instance played on this machine: the tools the user data and ec2_run.sh call, as shims.

Shared by the rehearsal (proving_ground/rehearsal/rehearse.py) and tests/training_assets/test_ec2_run_moto.py. The
scripts themselves run
for real with bash; what an instance has and this machine does not is played:

- ``curl``: the instance metadata service, answering from ``IMDS_<name>`` variables (token, instance-id, ...);
- ``docker``: a container runs its command here, with its mounts mapped to their host folders and what a container
  has on the instance: on Docker's bridge network no AWS credentials (the launch template's metadata hop limit of 1
  keeps IMDS, and so the instance role, from it), on ``--network host`` the host's unless the iptables rules reject its
  uid; the training container (the
  command that runs ``--check-only``) plays torchrun's rank 0, writing ``saved_model/`` and ``metrics.json`` (real
  training is tests/training_assets/test_container.py's subject): a copy of ``REHEARSAL_TRAINED_MODEL`` when set, else
  placeholder files; ``--log-driver awslogs`` sends the container's output to CloudWatch Logs with the host's
  credentials, as Docker's daemon does (CreateLogStream, then PutLogEvents);
- ``iptables``: records the rules ec2_run.sh adds (``IPTABLES_RULES``); a host-network container whose uid an OUTPUT
  rule rejects from IMDS gets no credentials either;
- ``nvidia-smi``: one A100; ``python3``: this Python; ``shutdown -h now``: the instance-initiated shutdown that
  terminates the instance (``InstanceInitiatedShutdownBehavior: terminate``), made by EC2 itself (``EC2_SERVICE_*``
  credentials); other ``shutdown`` calls (the max-run-hours timer) do nothing;
- ``aws``: the AWS CLI v1 that aws-cdk-lib ships (the DLAMI ships the CLI too), with the rehearsal's call gate when
  one is given; with a server of proving_ground/rehearsal/aws_calls.py (``aws_server``), each call is forked from it
  instead of a new
  Python importing the CLI (``AWS_CLIENT``), and runs in its own process as before when the server is gone.
"""

from __future__ import annotations

import atexit
import functools
import importlib.metadata
import io
import shutil
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

DOCKER = r"""#!{python}
import json, os, shutil, subprocess, sys
from pathlib import Path
args = sys.argv[1:]
if args[0] == "login":
    sys.stdin.read()
    sys.exit(0)
if args[0] == "build":
    sys.exit(0)
assert args[0] == "run", args
VALUED = {{"-v", "-w", "-e", "--ulimit", "--log-driver", "--log-opt", "--gpus", "--network", "--user", "--security-opt",
          "--device"}}
mounts, env, workdir, options, i = {{}}, {{}}, "/", {{}}, 1
while args[i].startswith("-"):
    option = args[i]
    if option in VALUED:
        value = args[i + 1]
        i += 2
        options.setdefault(option, []).append(value)
        if option == "-v":
            host, inside = value.split(":")[:2]
            mounts[inside] = host
        elif option == "-e":
            key, _, val = value.partition("=")
            env[key] = val
        elif option == "-w":
            workdir = value
    else:
        i += 1
command = args[i + 1 :]
log_options = dict(option.partition("=")[::2] for option in options.get("--log-opt", []))
def host_path(path):
    for inside, host in mounts.items():
        if path == inside or path.startswith(inside + "/"):
            return host + path[len(inside):]
    return path
def ship(text):
    # Docker's awslogs driver, with the daemon's (the host's) credentials.
    if options.get("--log-driver") != ["awslogs"]:
        return
    # No awslogs-region option: the daemon takes the instance's region from the metadata service.
    group, stream = log_options["awslogs-group"], log_options["awslogs-stream"]
    where = ["--region", os.environ["AWS_REGION"], "--log-group-name", group, "--log-stream-name", stream]
    subprocess.run(["aws", "logs", "create-log-stream", *where], check=True)
    events = json.dumps([{{"timestamp": 1, "message": line}} for line in text.splitlines() or ["(no output)"]])
    subprocess.run(["aws", "logs", "put-log-events", *where, "--log-events", events], check=True,
                   stdout=subprocess.DEVNULL)
if any("--check-only" in arg for arg in command):
    rendezvous = None
    for arg in command:
        if "--rdzv_endpoint=" in arg:
            rendezvous = arg.split("--rdzv_endpoint=", 1)[1].split()[0]
        elif "rendezvous --nodes" in arg and " --endpoint " in arg:  # rendezvous.py's barrier, then torchrun
            rendezvous = arg.split(" --endpoint ", 1)[1].split()[0]
    rank0 = rendezvous is None or rendezvous.split(":")[0] == os.environ.get("IMDS_local_ipv4")
    if rank0:
        output = Path(mounts["/opt/ml/output"])
        trained = os.environ.get("REHEARSAL_TRAINED_MODEL")
        if trained:
            shutil.copytree(trained, output / "saved_model")
        else:
            (output / "saved_model").mkdir(parents=True)
            (output / "saved_model" / "config.json").write_text('{{"model_type": "roberta"}}')
            (output / "saved_model" / "model.safetensors").write_bytes(b"weights")
        (output / "metrics.json").write_text('{{"eval_accuracy": 0.7}}')
    ship("rank 0: trained" if rank0 else "rank 1: trained")
    sys.exit(0)
# What the container sees: the network; the host's credentials only on the host network (IMDS within one hop) and
# as a uid whose packets to IMDS the host does not reject (the iptables shim's OUTPUT rules: ec2_run.sh's owner match).
env.update(PATH="{python_dir}:/usr/bin:/bin", HOME=mounts.get("/root", "/nonexistent"),
           AWS_ENDPOINT_URL=os.environ["AWS_ENDPOINT_URL"], AWS_EC2_METADATA_DISABLED="true",
           AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
uid = options.get("--user", ["0"])[0].split(":")[0]
rules = Path(os.environ.get("IPTABLES_RULES", "/nonexistent"))
rejected = rules.exists() and any(
    "169.254.169.254/32" in rule and rule.split("--uid-owner ")[-1].split()[0] == uid
    for rule in rules.read_text().splitlines() if rule.startswith("-I OUTPUT") and "--uid-owner" in rule)
if options.get("--network") == ["host"] and not rejected:
    env.update({{k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if k in os.environ}})
result = subprocess.run(command, cwd=host_path(workdir), env=env, capture_output=True, text=True)
sys.stdout.write(result.stdout)
sys.stderr.write(result.stderr)
ship(result.stdout + result.stderr)
sys.exit(result.returncode)
"""

# The `aws` command when a call server runs (proving_ground/rehearsal/aws_calls.py's serve): the arguments,
# environment, working folder
# and standard streams go to the server, whose forked child runs the CLI with them; its exit code comes back. Run
# with -I -S: the standard library only, so the shim itself costs a few milliseconds.
AWS_CLIENT = r"""#!{python} -IS
import json, os, socket, sys
os.environ["PYTHONPATH"] = {pythonpath!r}
argv = sys.argv[1:]
connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    connection.connect({server!r})
except OSError:  # no server (stopped): the CLI in a process of its own
    os.execv({python!r}, [{python!r}, "-m", "proving_ground.rehearsal.aws_calls", "aws", *argv])
fds = []
for fd in (0, 1, 2):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:  # a closed stream reads as empty and swallows what is written, as /dev/null does
        fds.append(os.open(os.devnull, os.O_RDWR))
call = json.dumps({{"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}}).encode() + b"\n"
sent = socket.send_fds(connection, [call], fds)
connection.sendall(call[sent:])
reply = b""
while chunk := connection.recv(64):
    reply += chunk
sys.exit(int(reply) if reply.strip() else 255)
"""

# The instance metadata the host reads (token, then instance-id / reservation-id / local-ipv4).
CURL = r"""#!{python}
import os, sys
url = next(arg for arg in sys.argv[1:] if arg.startswith("http"))
print("token" if url.endswith("/api/token") else os.environ["IMDS_" + url.rsplit("/", 1)[-1].replace("-", "_")], end="")
"""

NVIDIA_SMI = "#!/bin/sh\necho 'GPU 0: NVIDIA A100-SXM4-40GB'\n"

# The host's packet filter: each rule ec2_run.sh adds is written, one a line, to $IPTABLES_RULES (the docker shim
# reads the OUTPUT rules to decide whether a host-network container reaches IMDS).
IPTABLES = """#!/bin/sh
[ "$1" = -w ] && shift
[ -n "$IPTABLES_RULES" ] && echo "$*" >> "$IPTABLES_RULES"
exit 0
"""

# `shutdown -h now` powers the instance off; the launch template's shutdown behaviour terminates it (EC2's doing).
SHUTDOWN = """#!/bin/sh
[ "$2" = now ] || exit 0
AWS_ACCESS_KEY_ID="$EC2_SERVICE_ACCESS_KEY_ID" AWS_SECRET_ACCESS_KEY="$EC2_SERVICE_SECRET_ACCESS_KEY" \\
  aws ec2 terminate-instances --region "$AWS_REGION" --instance-ids "$IMDS_instance_id" >/dev/null
"""


def unpack_aws_cli(target: Path) -> Path:
    """The AWS CLI v1 bundled in aws-cdk-lib's dependency aws-cdk.asset-awscli-v1 (lib/layer.zip in its jsii
    tarball), unpacked under ``target``; returns its folder (``awscli/aws`` is the entry script)."""
    tarball = next(
        file for file in importlib.metadata.files("aws-cdk.asset-awscli-v1") or [] if str(file).endswith(".jsii.tgz")
    )
    with tarfile.open(Path(str(tarball.locate()))) as package:
        layer = package.extractfile("package/lib/layer.zip")
        assert layer is not None
        zipfile.ZipFile(io.BytesIO(layer.read())).extractall(target)
    return target / "awscli"


@functools.cache
def shared_aws_cli() -> Path:
    """``unpack_aws_cli`` once per process (37 MB, only read; its first call compiles the CLI's modules, 0.7 CPU-s,
    and later calls read the bytecode), removed when the process ends: every rehearsal and host test uses it."""
    folder = Path(tempfile.mkdtemp(prefix="awscli-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return unpack_aws_cli(folder)


def install_host_tools(bin_dir: Path, aws_cli: Path, *, gated: bool = False, aws_server: Path | None = None) -> Path:
    """Write the shims into ``bin_dir`` (put it first on the host's PATH). ``gated``: the ``aws`` shim runs the CLI
    under the call gate named by ``REHEARSAL_GATE`` (proving_ground/rehearsal/aws_calls.py); ``aws_server``: the
    socket of a gated
    call server (``proving_ground.rehearsal.aws_calls.start_server``) that runs them."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    if aws_server is not None and not gated:
        raise ValueError("aws_server: the call server runs the gated CLI; set gated=True")
    if aws_server is not None:
        aws = AWS_CLIENT.format(python=python, pythonpath=f"{ROOT}:{aws_cli}", server=str(aws_server))
    elif gated:
        aws = (
            f'#!/bin/sh\nPYTHONPATH="{ROOT}:{aws_cli}" exec "{python}" -m proving_ground.rehearsal.aws_calls aws "$@"\n'
        )
    else:
        aws = f'#!/bin/sh\nPYTHONPATH="{aws_cli}" exec "{python}" "{aws_cli}/aws" "$@"\n'
    scripts = {
        "docker": DOCKER.format(python=python, python_dir=Path(python).parent),
        "curl": CURL.format(python=python),
        "nvidia-smi": NVIDIA_SMI,
        "iptables": IPTABLES,
        "aws": aws,
        "python3": f'#!/bin/sh\nexec "{python}" "$@"\n',
        "shutdown": SHUTDOWN,
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def filter_reservations_with_reservation_id(reservations: list[Any], filters: dict[str, Any]) -> list[Any]:
    """moto 5.2.5's DescribeInstances lacks the documented ``reservation-id`` filter (NotImplementedError), which
    ec2_run.sh uses to find the nodes of its run: apply it to the reservations, the other filters as moto does."""
    from moto.ec2.utils import filter_reservations

    filters = dict(filters)
    wanted = filters.pop("reservation-id", None)
    kept = [reservation for reservation in reservations if wanted is None or reservation.id in wanted]
    return filter_reservations(kept, filters) if filters else kept


def patch_moto_reservation_filter() -> Any:
    """Install ``filter_reservations_with_reservation_id`` into moto (in this process); returns the undo."""
    from moto.ec2.models import instances

    original = instances.filter_reservations
    instances.filter_reservations = filter_reservations_with_reservation_id  # type: ignore[assignment]

    def undo() -> None:
        instances.filter_reservations = original

    return undo
