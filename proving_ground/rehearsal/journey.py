"""What every step of the rehearsal shares: its principals and their keys, the steps and their report,
and ``RehearsalBase``: the clients, credentials, shell and stack outputs the steps act through.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops_review.review import StackTemplate
from proving_ground.rehearsal.aws_calls import (
    GATE_ENV,
    STEP_ENV,
    Gate,
    Principal,
    Record,
)
from stacks.settings import EnvironmentSettings, TrainingSettings, parse_environment

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"  # moto's default account
MODEL_KEY = "endpoints/sentiment/rehearsal.tar.gz"
TEXT = "Covid cases are increasing fast!"
MME_MODEL = "sentiment-rehearsal.tar.gz"
# The @remote job runs this machine's Python here while the default job image (the image table's entry for
# training.remote_image_tag) runs its own, and remote_train refuses a mismatch, as it must: the rehearsal names a
# stand-in tag of the same repository (so the job role's pull grant is the real one) that spells this Python.
REMOTE_IMAGE = "763104351884.dkr.ecr.{region}.amazonaws.com/" + (
    f"{TrainingSettings().remote_image.image}-py{sys.version_info.major}{sys.version_info.minor}"
)

# The one refusal a tool is built to meet: boto3's Bucket.creation_date lists all buckets and treats AccessDenied as
# "unknown" (boto3/s3/inject.py bucket_load); sagemaker-core then checks its bucket with ListObjectsV2. Any other
# refusal fails its step, even when the tool that met it carried on.
TOLERATED_REFUSALS = {("s3", "ListBuckets")}

DEPLOYER, OPERATOR, AWS_SERVICE = "cloudformation (deploy)", "operator (administrator)", "aws service"
# The Graviton serving image the operator publishes before deploying the endpoint (a digest from the tooling account).
SERVING_IMAGE = "graviton-serving"
SERVING_DIGEST = f"999999999999.dkr.ecr.us-west-2.amazonaws.com/pytorch-platform/{SERVING_IMAGE}@sha256:{'ab' * 32}"
LAUNCHER, INSTANCE, ENDPOINT_ROLE = "training launcher", "training instance role", "endpoint execution role"
MME_CLIENT, REMOTE_LAUNCHER, REMOTE_JOB = "multi-model client", "@remote launcher", "@remote job role"
MODEL_CHECK = "model archive check"
# The Training stack's TrainingLauncher function (its role): the only principal that launches from the template.
RUN_LAUNCHER = "training run launcher"
ENDPOINT_OPERATOR = "endpoint operator"  # holds only `change-endpoint-instance --print-policy`
# Each principal's access key (AKIA + this): the gate knows a principal by its key.
KEYS = {DEPLOYER: "deployer0000", OPERATOR: "operator0000", AWS_SERVICE: "awsservice00", LAUNCHER: "launcher0000",
        INSTANCE: "instance0000", ENDPOINT_ROLE: "endpointrole", MME_CLIENT: "mmeclient000",
        REMOTE_LAUNCHER: "remotelaunch", REMOTE_JOB: "remotejob000", MODEL_CHECK: "modelcheck00",
        RUN_LAUNCHER: "runlauncher0", ENDPOINT_OPERATOR: "endpointoper"}  # fmt: skip

# The services the hosts' and the operator's AWS CLI calls reach (the call server loads their models ahead).
HOST_CLI_SERVICES = ("s3", "ec2", "logs", "ecr", "ssm", "sts", "sagemaker-runtime")

STEPS = (
    "synth",
    "preflight",
    "deploy",
    "EC2 training run",
    "package and upload",
    "check-model",
    "publish to the multi-model endpoint",
    "serve and invoke locally",
    "deploy the endpoint and smoke-test it",
    "change-endpoint-instance",
    "@remote",
    "destroy and clean up",
)


class StepFailed(Exception):
    """A step of the journey did not do what the docs say; the message says what was seen."""


@dataclass
class StepResult:
    step: str
    seconds: float
    ok: bool
    detail: str


@dataclass
class Report:
    environment: str
    results: list[StepResult]
    records: list[Record]
    coverage: list[str] = field(default_factory=list)  # the deployment's table (deployment.Coverage.lines)

    @property
    def ok(self) -> bool:
        return len(self.results) == len(STEPS) and all(r.ok for r in self.results)

    @property
    def failed_step(self) -> str | None:
        return next((r.step for r in self.results if not r.ok), None)

    def lines(self) -> list[str]:
        lines = [f"rehearsal of {self.environment}:"]
        for number, result in enumerate(self.results, start=1):
            mark = "ok  " if result.ok else "FAIL"
            lines.append(f"  {mark} {number:2}. {result.step} ({result.seconds:.1f} s): {result.detail}")
        by_principal: dict[str, list[Record]] = {}
        for record in self.records:
            by_principal.setdefault(record.principal, []).append(record)
        if self.coverage:
            lines.append("Resources per type: played by moto's CloudFormation, created by hand through the API, "
                         "not emulated:")  # fmt: skip
            lines += self.coverage
        lines.append("AWS calls (checked against the principal's synthesized policies, or recorded only):")
        for principal, records in sorted(by_principal.items()):
            checked = [r for r in records if r.allowed is not None]
            refused = [r for r in checked if r.allowed is False]
            tolerated = [r for r in refused if (r.service, r.operation) in TOLERATED_REFUSALS]
            verdict = f"{len(checked)} checked, {len(refused)} refused" if checked else "recorded, not checked"
            if tolerated:
                verdict += f" ({len(tolerated)} tolerated: {', '.join(sorted({r.operation for r in tolerated}))})"
            lines.append(f"  {principal}: {len(records)} calls ({verdict})")
        return lines


_sessions: dict[str, Any] = {}  # region -> this process's boto3 session for the rehearsal's own clients
_sessions_lock = threading.Lock()


def boto3_session(region: str) -> Any:
    """One boto3 session per region and process: a session keeps the service models and endpoint rules its clients
    loaded, so a new session per client loaded them again (50 times in a rehearsal), and a new one per rehearsal
    once more in each rehearsal of a process. Its clients bring their own endpoint and keys."""
    import boto3

    with _sessions_lock:
        if region not in _sessions:
            _sessions[region] = boto3.session.Session(region_name=region)
        return _sessions[region]


def make_principal(
    name: str,
    key: str,
    policies: list[dict[str, Any]] | None,
    arn: str,
    session: str,
    tags: dict[str, str] | None = None,
) -> Principal:
    """A principal acting with its own key; ``tags``: its role's tags, which IAM gives every request as
    aws:PrincipalTag/<key> (the data perimeter's bucket and key policies read them)."""
    identity = {"aws:PrincipalArn": arn, "aws:userid": f"AROA{key[-12:].upper()}:{session}"}
    identity.update({f"aws:PrincipalTag/{k}": v for k, v in (tags or {}).items()})
    return Principal(name=name, access_key=f"AKIA{key.upper()}", policies=policies, identity=identity)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Endpoint name (lower case) -> the played endpoint: (request body, TargetModel) -> (answer, content type).
ENDPOINT_HANDLERS: dict[str, Callable[[str, str | None], tuple[str, str]]] = {}


if TYPE_CHECKING:  # deployment.py imports this module's constants
    from proving_ground.rehearsal.deployment import Deployment


class RehearsalBase:
    """The rehearsal's state and plumbing; the steps (platform_steps, training_steps, serving_steps) act through it."""

    def __init__(self, assembly: Path, environment: str, work: Path, trained_model: Path) -> None:
        self.assembly = Path(assembly)
        self.environment = environment
        self.work = Path(work)
        self.trained_model = Path(trained_model)
        self.results: list[StepResult] = []
        self.endpoint_url = ""
        self.gate: Gate | None = None
        self.deployment: Deployment | None = None
        self.local_server: Any = None
        self._stopping: list[threading.Thread] = []
        self.facts: dict[str, Any] = {}
        self.stacks: dict[str, StackTemplate] = {}
        self.bin_dir = self.work / "bin"
        self.gate_file = self.work / "gate.json"
        self.uninstall: Callable[[], None] = lambda: None
        self._clients: dict[tuple[str, str], Any] = {}
        self.endpoint_interfaces: dict[str, list[str]] = {}  # endpoint name (lower case) -> its network interfaces
        self.destroyed: list[str] = []  # what the destroy step's waits said and what the stacks retained
        self._clients_lock = threading.Lock()

    def client(self, service: str, principal: str = DEPLOYER) -> Any:
        """A client of the moto server acting as ``principal`` (its keys; the gate knows it by them). One per service
        and principal, all from the process's session of the region (``_session``). The gate asks for clients from
        the SDK's threads too: the lock."""
        assert self.gate is not None
        with self._clients_lock:
            key = (service, principal)
            if key not in self._clients:
                credentials = self.gate.principal(principal)
                self._clients[key] = boto3_session(self.region).client(
                    service,
                    endpoint_url=self.endpoint_url,
                    aws_access_key_id=credentials.access_key,
                    aws_secret_access_key=credentials.secret_key,
                )
            return self._clients[key]

    @contextlib.contextmanager
    def acting_as(self, principal: str) -> Iterator[None]:
        """This process's default credentials (boto3 sessions created now) are the principal's."""
        assert self.gate is not None
        saved = {name: os.environ.get(name) for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        os.environ.update(self.gate.principal(principal).environment())
        try:
            yield
        finally:
            for name, value in saved.items():
                os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)

    def shell(self, principal: str, command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """A command on the operator's (or a launcher's) machine: the gated AWS CLI first on PATH."""
        assert self.gate is not None
        env = {**self._base_environment(), **self.gate.principal(principal).environment(), **kwargs.pop("env", {})}
        return subprocess.run(command, env=env, capture_output=True, text=True, check=False, **kwargs)

    def _base_environment(self) -> dict[str, str]:
        return {
            "PATH": f"{self.bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(self.work),
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "AWS_EC2_METADATA_DISABLED": "true",
            GATE_ENV: str(self.gate_file),
            STEP_ENV: os.environ.get(STEP_ENV, ""),
            "PYTHONPATH": str(ROOT),
        }

    @property
    def region(self) -> str:
        return self.stacks["Foundation"].region or "us-west-2"

    def stack_output(self, stack_id: str, name: str) -> str:
        assert self.deployment is not None
        return self.deployment.deployed[stack_id].outputs[name]

    def stack_output_of_template(self, stack_id: str, name: str) -> str:
        """An output of a stack not deployed yet whose value is a literal (the model key)."""
        if stack_id not in self.stacks:
            raise StepFailed(
                f"{self.environment} has no {stack_id} stack in {self.assembly}: set "
                f"environments.{self.environment}.graviton_endpoint.model_data_key (README, First deploy, step 3)"
            )
        value = self.stacks[stack_id].template["Outputs"][name]["Value"]
        if not isinstance(value, str):
            raise StepFailed(f"{stack_id} output {name} is not a literal")
        return value

    def remote_caller_suffix(self) -> str:
        """The construct-id suffix of the rehearsed @remote caller: the environment's first (stacks/foundation.py,
        caller_construct_suffix)."""
        return self.settings().training.remote_callers[0].capitalize()

    def settings(self) -> EnvironmentSettings:
        """The rehearsed environment's settings, as cdk.json gives them."""
        context = json.loads((ROOT / "cdk.json").read_text())["context"]
        return parse_environment(self.environment, context["environments"][self.environment])

    def refresh_role_policies(self) -> None:
        """A stack deployed later may attach policies to a role (the endpoint stacks' image pull policies)."""
        assert self.gate is not None and self.deployment is not None
        for principal in self.gate.principals:
            arn = principal.identity["aws:PrincipalArn"]
            if principal.policies is not None and principal.name in (INSTANCE, ENDPOINT_ROLE, REMOTE_JOB):
                principal.policies = self.deployment.role_policies(arn.rsplit("/", 1)[-1])
        self.gate.topic_policies, self.gate.endpoint_policies = self.deployment.topic_and_endpoint_policies()
        self.gate.save(self.gate_file)
