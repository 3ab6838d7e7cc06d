"""The real ``@remote`` path of sagemaker-core, run against moto with the config.yaml and the IAM policies of the
synthesized dev templates, every API call checked against the policy of the identity that makes it.

``python -m training_assets.remote_train ... train`` (and ``sweep``) run unchanged. A harness wraps botocore's
``BaseClient._make_api_call``: each call is recorded, mapped to the IAM requests it needs (proving_ground/
iam_policy.py) and evaluated against the caller's launcher policy (the data scientist) or, for the calls the
training job makes (and SageMaker's log writes, which use the job's role), the caller's RemoteJobRole's policies;
a refused call gets the AccessDenied error IAM would send, so the SDK meets exactly the errors it would meet in AWS.

What moto does not do, the harness does (test-only workarounds, none in product code):
- moto enforces no IAM: the harness does, as above.
- moto's CreateTrainingJob marks the job Completed at once and runs nothing: right after it returns, the harness
  plays the job in-process as the job role (the SDK's own ``invoke_function`` entry point with the request's
  container arguments and secret key), with ``train()`` replaced by a stub that writes a model, and writes the
  job's log stream as SageMaker would, with the job's role.
- The harness runs this machine's Python while the default job image (the image table's entry for
  training.remote_image_tag) runs its own: it passes ``--image-uri`` with a stand-in tag of that image's repository
  that spells this Python (the version check refuses a mismatch, as it must).
- RemoteExecutor's polling intervals (1 s / 10 s) and the job waiter's first sleep (5 s) are set to 0.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import io
import json
import os
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import botocore.client
import pytest
import yaml
from botocore.exceptions import ClientError

from ops_review.iam_policy import Request, Unsupported, is_allowed, resolve
from proving_ground.iam_requests import Call, logical_id, requests_for, role_policies
from stacks.settings import TrainingSettings
from tests.conftest import cdk_context
from tests.stacks.security.exports import template_exports
from training_assets import remote_train

# The SDK's config validated once per distinct config (tests/conftest.py): ~1 CPU-s per job otherwise.
pytestmark = pytest.mark.usefixtures("sdk_config_validated_once")

moto = pytest.importorskip("moto")

ROOT = Path(remote_train.__file__).resolve().parents[1]
ACCOUNT, REGION = "123456789012", "us-west-2"
STAND_IN_IMAGE = f"763104351884.dkr.ecr.{REGION}.amazonaws.com/" + (
    f"{TrainingSettings().remote_image.image}-py{sys.version_info.major}{sys.version_info.minor}"
)
LAUNCHER, OTHER_LAUNCHER, JOB = "launcher", "other-launcher", "job"
# Two callers of the dev environment (training.remote_callers): A's data scientist, B's, and A's job role as
# SageMaker assumes it; the global condition keys IAM sets for each (IAM User Guide, "AWS global condition context
# keys"). sts:GetCallerIdentity answers each principal's own UserId, as STS does.
CALLER, OTHER_CALLER = cdk_context()["environments"]["dev"]["training"]["remote_callers"][:2]
IDENTITIES = {
    LAUNCHER: {"aws:userid": "AROADATASCIENTIST:alice@example.com",
               "aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/data-scientist-{CALLER}"},
    OTHER_LAUNCHER: {"aws:userid": "AROADATASCIENTIST:bob@example.com",
                     "aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/data-scientist-{OTHER_CALLER}"},
    JOB: {"aws:userid": "AROAREMOTEJOBROLE:SageMaker",
          "aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/dev-Foundation-RemoteJobRole{CALLER.capitalize()}"},
}  # fmt: skip
# The one refusal the SDK is built to meet: boto3's Bucket.creation_date lists all buckets and treats AccessDenied as
# "unknown" (boto3/s3/inject.py bucket_load); the SDK then checks the configured bucket with ListObjectsV2.
TOLERATED_REFUSALS = {("s3", "ListBuckets")}


# ------------------------------------------------------------------------------------------------- the harness


@dataclass
class Recorded:
    principal: str
    call: Call
    requests: list[Request]
    allowed: bool


@dataclass
class Platform:
    """The dev environment's resources in moto, and what the templates say about them."""

    config_path: Path
    config: dict[str, Any]
    policies: dict[str, list[dict[str, Any]]]
    buckets: dict[str, str]  # RemoteJobs/Datasets/Artifacts -> bucket name
    key_arn: str
    role_arn: str  # the caller's job role; other_* are the other caller's
    subnets: list[str]
    security_group: str
    parameter_name: str
    other_role_arn: str
    other_security_group: str
    calls: list[Recorded] = field(default_factory=list)
    job_exit_codes: list[int] = field(default_factory=list)
    create_requests: list[dict[str, Any]] = field(default_factory=list)

    def refused(self, principal: str | None = None) -> list[tuple[str, str]]:
        return [(r.call.service, r.call.operation) for r in self.calls
                if not r.allowed and principal in (None, r.principal)]  # fmt: skip

    def operations(self, principal: str) -> set[tuple[str, str]]:
        return {(r.call.service, r.call.operation) for r in self.calls if r.principal == principal}


_principal: contextvars.ContextVar[str | None] = contextvars.ContextVar("principal", default=None)


# Long: every resource of the dev templates the @remote path touches, created in moto one after the other.
def _create_platform(templates: dict[str, dict[str, dict]], tmp_path: Path) -> Platform:
    """Create the dev resources the @remote path touches, resolve the templates against them, write config.yaml."""
    foundation, training = templates["dev"]["Foundation"], templates["dev"]["Training"]
    kms, s3, iam, ec2 = (boto3.client(name, region_name=REGION) for name in ("kms", "s3", "iam", "ec2"))
    key = kms.create_key(Description="platform key")["KeyMetadata"]
    roles, groups = {}, {}
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.40.{i}.0/24")["Subnet"]["SubnetId"] for i in (1, 2)]
    # The endpoints' group and each caller's own group: a request naming another is refused by the launcher policy.
    workload = ec2.create_security_group(GroupName="workload", Description="workload", VpcId=vpc)["GroupId"]
    for caller in (CALLER, OTHER_CALLER):
        role_id = logical_id(foundation, "AWS::IAM::Role", f"RemoteJobRole{caller.capitalize()}")
        roles[caller] = iam.create_role(RoleName=f"dev-Foundation-RemoteJobRole{caller.capitalize()}",
                                        AssumeRolePolicyDocument=json.dumps(foundation["Resources"][role_id]
                                        ["Properties"]["AssumeRolePolicyDocument"]))["Role"]  # fmt: skip
        groups[caller] = ec2.create_security_group(GroupName=f"remote-jobs-{caller}", Description="remote jobs",
                                                   VpcId=vpc)["GroupId"]  # fmt: skip
    buckets = {}
    for name in ("RemoteJobs", "Datasets", "Artifacts"):
        buckets[name] = f"dev-foundation-{name.lower()}-moto"
        s3.create_bucket(Bucket=buckets[name], CreateBucketConfiguration={"LocationConstraint": REGION})
        default = {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key["Arn"]}
        s3.put_bucket_encryption(Bucket=buckets[name], ServerSideEncryptionConfiguration={
            "Rules": [{"ApplyServerSideEncryptionByDefault": default}]})  # fmt: skip

    refs: dict[str, Any] = {"AWS::AccountId": ACCOUNT, "AWS::Partition": "aws", "AWS::Region": REGION,
                            "AWS::URLSuffix": "amazonaws.com"}  # fmt: skip
    key_id = logical_id(foundation, "AWS::KMS::Key", "PlatformKey")
    refs.update({key_id: key["KeyId"], f"{key_id}.Arn": key["Arn"]})
    for caller in (CALLER, OTHER_CALLER):
        role_id = logical_id(foundation, "AWS::IAM::Role", f"RemoteJobRole{caller.capitalize()}")
        refs.update({role_id: roles[caller]["RoleName"], f"{role_id}.Arn": roles[caller]["Arn"]})
        group_id = logical_id(foundation, "AWS::EC2::SecurityGroup", f"RemoteJobsSecurityGroup{caller.capitalize()}")
        refs[f"{group_id}.GroupId"] = groups[caller]  # each caller's config.yaml names its own
    for name, bucket in buckets.items():
        bucket_id = logical_id(foundation, "AWS::S3::Bucket", name)
        refs.update({bucket_id: bucket, f"{bucket_id}.Arn": f"arn:aws:s3:::{bucket}"})
    for i, subnet in enumerate(subnets, start=1):
        refs[logical_id(foundation, "AWS::EC2::Subnet", f"VpcPrivateSubnet{i}Subnet")] = subnet
    refs[f"{logical_id(foundation, 'AWS::EC2::SecurityGroup', 'WorkloadSecurityGroup')}.GroupId"] = workload
    refs[logical_id(foundation, "AWS::EC2::VPC", "Vpc")] = vpc  # the ec2:Vpc condition of the VPC attachment

    def launcher(caller: str) -> list[dict[str, Any]]:
        policy_id = logical_id(foundation, "AWS::IAM::ManagedPolicy", f"RemoteJobLauncherPolicy{caller.capitalize()}")
        return [resolve(foundation["Resources"][policy_id]["Properties"]["PolicyDocument"], refs=refs)]

    job_role_id = logical_id(foundation, "AWS::IAM::Role", f"RemoteJobRole{CALLER.capitalize()}")
    policies = {LAUNCHER: launcher(CALLER), OTHER_LAUNCHER: launcher(OTHER_CALLER),
                JOB: role_policies(foundation, job_role_id, refs)}  # fmt: skip
    # Each caller's config.yaml as CloudFormation writes it to SSM (A's fetched by A in _fetch_config).
    ssm = boto3.client("ssm", region_name=REGION)
    parameters = {name: r for name, r in training["Resources"].items() if r["Type"] == "AWS::SSM::Parameter"}
    exports = template_exports(foundation, refs)
    for parameter in parameters.values():
        text = resolve(parameter["Properties"]["Value"], refs=refs, exports=exports)
        ssm.put_parameter(Name=parameter["Properties"]["Name"], Value=text, Type="String")
    (own,) = [p for name, p in parameters.items() if name.startswith(f"RemoteFunctionConfig{CALLER.capitalize()}")]
    text = resolve(own["Properties"]["Value"], refs=refs, exports=exports)
    return Platform(config_path=tmp_path / "config.yaml", config=yaml.safe_load(text), policies=policies,
                    buckets=buckets, key_arn=key["Arn"], role_arn=roles[CALLER]["Arn"], subnets=subnets,
                    security_group=groups[CALLER], parameter_name=own["Properties"]["Name"],
                    other_role_arn=roles[OTHER_CALLER]["Arn"], other_security_group=groups[OTHER_CALLER])  # fmt: skip


def _fetch_config(platform: Platform) -> None:
    """The README's first step, as the launcher: `aws ssm get-parameter ... > config.yaml`."""
    with _as(LAUNCHER):
        value = boto3.client("ssm", region_name=REGION).get_parameter(Name=platform.parameter_name)["Parameter"]
    platform.config_path.write_text(value["Value"])


def _play_job(platform: Platform, request: dict[str, Any]) -> None:
    """What SageMaker would run for this CreateTrainingJob: the SDK's invoke_function as the job role, then logs."""
    from sagemaker.core.remote_function import invoke_function

    environment = {"REMOTE_FUNCTION_SECRET_KEY": request["Environment"]["REMOTE_FUNCTION_SECRET_KEY"]}
    with _as(JOB), _environment(environment):
        try:
            invoke_function.main(request["AlgorithmSpecification"]["ContainerArguments"])
        except SystemExit as exit_:
            platform.job_exit_codes.append(int(exit_.code or 0))
    with _as(None):  # the account's one group, made once: not the job's doing
        logs = boto3.client("logs", region_name=REGION)
        group, stream = "/aws/sagemaker/TrainingJobs", f"{request['TrainingJobName']}/algo-1-{int(time.time())}"
        with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
            logs.create_log_group(logGroupName=group)
    # SageMaker writes the job's logs with the job's role (CreateTrainingJob, RoleArn): checked as the job.
    with _as(JOB):
        logs = boto3.client("logs", region_name=REGION)
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
        event = {"timestamp": int(time.time() * 1000), "message": "INFO: training finished"}
        logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=[event])


_job_lock = threading.Lock()  # one played job at a time: each sets its own secret key in the environment


@contextlib.contextmanager
def _as(principal: str | None) -> Iterator[None]:
    token = _principal.set(principal)
    try:
        yield
    finally:
        _principal.reset(token)


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)


# Long: the fixture sets up the SDK's environment, the gate and the platform, and restores each in its teardown.
@pytest.fixture()
def platform(
    templates: dict[str, dict[str, dict]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Platform]:
    """moto with the dev resources; every botocore call made by a principal is checked against its policies."""
    from sagemaker.core.remote_function import client as remote_client
    from sagemaker.core.remote_function import job as remote_job

    for name, value in {"AWS_ACCESS_KEY_ID": "moto", "AWS_SECRET_ACCESS_KEY": "moto", "AWS_DEFAULT_REGION": REGION,
                        "SM_MODEL_DIR": str(tmp_path / "job" / "model")}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    for name in ("SAGEMAKER_USER_CONFIG_OVERRIDE", "SAGEMAKER_ADMIN_CONFIG_OVERRIDE", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    # moto's own setting: no EC2 backend loads its ~hundreds of default AMIs (each one created loads them all), as
    # nothing here launches an instance.
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(remote_train, "JOB_INPUT_DIR", tmp_path / "job" / "input")
    monkeypatch.setattr(remote_train, "train", stub_train)
    # sagemaker-core has no public setting for RemoteExecutor's polling intervals (1 s / 10 s): its private table.
    monkeypatch.setattr(remote_client, "_API_CALL_LIMIT", dict.fromkeys(remote_client._API_CALL_LIMIT, 0))
    # The SDK sleeps 5 s before its first DescribeTrainingJob; moto's job is complete at once.
    monkeypatch.setattr(remote_job, "_wait_until", functools.partial(remote_job._wait_until, poll=0))
    boto3.DEFAULT_SESSION = None
    with moto.mock_aws():
        platform = _create_platform(templates, tmp_path)
        encrypted = {bucket: platform.key_arn for bucket in platform.buckets.values()}
        original = botocore.client.BaseClient._make_api_call

        def checked_call(client: Any, operation: str, params: dict[str, Any]) -> Any:
            principal = _principal.get()
            if principal is None:
                return original(client, operation, params)
            call = Call(client.meta.service_model.service_name, operation, dict(params), client.meta.region_name,
                        ACCOUNT)  # fmt: skip
            identity = {**IDENTITIES[principal], "aws:PrincipalAccount": ACCOUNT}
            try:
                requests = requests_for(call, kms_encrypted_buckets=encrypted, principal=identity,
                                        resource_tags=_tags_in_moto)  # fmt: skip
            except Unsupported:  # recorded as refused: a call in a thread that swallows errors still fails the test
                platform.calls.append(Recorded(principal, call, [], allowed=False))
                raise
            allowed = all(is_allowed(platform.policies[principal], request) for request in requests)
            platform.calls.append(Recorded(principal, call, requests, allowed))
            if not allowed:
                raise ClientError({"Error": {"Code": "AccessDenied", "Message": f"{principal} may not {requests}"},
                                   "ResponseMetadata": {"HTTPStatusCode": 403}}, operation)  # fmt: skip
            if (call.service, operation) == ("sts", "GetCallerIdentity"):
                return {"UserId": identity["aws:userid"], "Account": ACCOUNT, "Arn": identity["aws:PrincipalArn"]}
            response = original(client, operation, params)
            # Only the jobs of A's role are played (as JOB): B's, created by the attack test, only exist.
            if (call.service, operation) == ("sagemaker", "CreateTrainingJob") and params[
                "RoleArn"
            ] == platform.role_arn:
                platform.create_requests.append(params)
                with _job_lock:
                    _play_job(platform, params)
            return response

        monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", checked_call)
        _propagate_principal_to_threads(monkeypatch)
        _fetch_config(platform)
        yield platform
    boto3.DEFAULT_SESSION = None


def _tags_in_moto(arn: str) -> dict[str, str]:
    """A training job's tags as SageMaker holds them (read outside any principal: IAM's own lookup)."""
    with _as(None):
        sagemaker = boto3.client("sagemaker", region_name=REGION)
        try:
            return {t["Key"]: t["Value"] for t in sagemaker.list_tags(ResourceArn=arn)["Tags"]}
        except ClientError:  # no such job: no tags
            return {}


def _propagate_principal_to_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls made in worker threads belong to whoever started the work: s3transfer uploads and downloads in a
    thread pool, RemoteExecutor submits and polls from its own threads. Without this they would go unchecked."""
    submit, start, run = ThreadPoolExecutor.submit, threading.Thread.start, threading.Thread.run

    def submit_in_context(self: ThreadPoolExecutor, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        return submit(self, contextvars.copy_context().run, fn, *args, **kwargs)

    def start_in_context(self: threading.Thread) -> None:
        self._principal_context = contextvars.copy_context()  # type: ignore[attr-defined]
        start(self)

    def run_in_context(self: threading.Thread) -> None:
        context = getattr(self, "_principal_context", None)
        context.run(run, self) if context is not None else run(self)

    monkeypatch.setattr(ThreadPoolExecutor, "submit", submit_in_context)
    monkeypatch.setattr(threading.Thread, "start", start_in_context)
    monkeypatch.setattr(threading.Thread, "run", run_in_context)


def stub_train(config: Any) -> dict[str, Any]:
    """Stands in for train_sentiment.train inside the played job: checks the downloaded dataset, writes a model."""
    dataset = Path(config.dataset)
    assert (dataset / "train.csv").is_file() and (dataset / "validation.csv").is_file()
    saved = Path(config.output_dir) / "saved_model"
    saved.mkdir(parents=True)
    (saved / "model.safetensors").write_bytes(b"weights")
    metrics = {"epochs": [{"epoch": 1.0, "eval_macro_f1": 1 - config.learning_rate * 1e4, "eval_accuracy": 0.5}],
               "throughput": {"train_samples_per_second": 100.0}}  # fmt: skip
    (Path(config.output_dir) / "metrics.json").write_text(json.dumps(metrics))
    return metrics


def upload_dataset(platform: Platform) -> str:
    """A two-row dataset in the Datasets bucket; its S3 prefix."""
    s3 = boto3.client("s3", region_name=REGION)
    for split in ("train", "validation"):
        s3.put_object(Bucket=platform.buckets["Datasets"], Key=f"tweets/{split}.csv", Body=b"text,label\nhi,1\n")
    return f"s3://{platform.buckets['Datasets']}/tweets/"


def run_launcher(platform: Platform, *argv: str, principal: str = LAUNCHER) -> tuple[int, str]:
    """``python -m training_assets.remote_train`` as ``principal`` with the fetched config.yaml; (0, its output)."""
    out, err = io.StringIO(), io.StringIO()
    with _as(principal), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = remote_train.main(["--config", str(platform.config_path), "--image-uri", STAND_IN_IMAGE, *argv])
    assert code == 0, err.getvalue()
    return code, out.getvalue()


# ------------------------------------------------------------------------------------------------------ tests


def test_train_runs_the_real_remote_path_within_the_launcher_policy(platform: Platform) -> None:
    dataset = upload_dataset(platform)
    code, out = run_launcher(platform, "train", "--", "--dataset", dataset, "--epochs", "1")

    assert code == 0, out
    assert ("ssm", "GetParameter") in platform.operations(LAUNCHER)  # config.yaml fetched under the launcher policy
    assert "INFO: training finished" in out  # job.wait() printed the job's log stream
    assert json.loads(out[out.rindex('{\n  "epochs"') :])["epochs"][0]["epoch"] == 1.0
    assert platform.job_exit_codes == [0]
    # Every launcher call is allowed by the launcher policy, but the one refusal the SDK tolerates.
    assert set(platform.refused(LAUNCHER)) <= TOLERATED_REFUSALS, platform.refused(LAUNCHER)
    assert platform.refused(JOB) == []
    launcher_calls = platform.operations(LAUNCHER)
    for operation in ("CreateTrainingJob", "DescribeTrainingJob"):
        assert ("sagemaker", operation) in launcher_calls
    # Staged the function, arguments and workspace, read the results; job.wait() followed the job's log stream.
    assert {("s3", "PutObject"), ("s3", "GetObject"), ("logs", "DescribeLogStreams"), ("logs", "GetLogEvents")} <= (
        launcher_calls
    )
    # The job (as the RemoteJobRole) read the function and the dataset and wrote its results.
    assert {("s3", "GetObject"), ("s3", "ListObjectsV2"), ("s3", "PutObject")} <= platform.operations(JOB)
    # Only the RemoteJobs bucket: never the SDK's default bucket sagemaker-<region>-<account>.
    touched = {r.call.params["Bucket"] for r in platform.calls if r.principal == LAUNCHER and "Bucket" in r.call.params}
    assert touched == {platform.buckets["RemoteJobs"]}
    assert ("s3", "CreateBucket") not in launcher_calls and ("s3", "HeadBucket") not in launcher_calls

    (request,) = platform.create_requests
    caller = CALLER
    root = f"s3://{platform.buckets['RemoteJobs']}/jobs/{caller}/"  # the caller's own prefix
    assert request["TrainingJobName"].startswith(f"{caller}-")  # what the caller's launcher policy creates
    assert request["RoleArn"] == platform.role_arn  # the caller's own job role
    assert request["OutputDataConfig"]["S3OutputPath"].startswith(root)
    assert request["OutputDataConfig"]["KmsKeyId"] == platform.key_arn
    channels = request["InputDataConfig"]
    assert all(channel["DataSource"]["S3DataSource"]["S3Uri"].startswith(root) for channel in channels)
    assert request["VpcConfig"] == {"Subnets": platform.subnets, "SecurityGroupIds": [platform.security_group]}
    resources = request["ResourceConfig"]
    remote_function = platform.config["SageMaker"]["PythonSDK"]["Modules"]["RemoteFunction"]
    assert resources["InstanceType"] == remote_function["InstanceType"] and resources["InstanceCount"] == 1
    assert "VolumeKmsKeyId" not in resources  # SageMaker refuses a volume key for p4d's NVMe instance storage
    assert {"Key": "environment", "Value": "dev"} in request["Tags"]
    assert {"Key": "remote-job-owner", "Value": caller} in request["Tags"]
    assert request["AlgorithmSpecification"]["TrainingImage"] == STAND_IN_IMAGE
    # The played job left the model where SageMaker packs output/model.tar.gz from.
    assert (Path(os.environ["SM_MODEL_DIR"]) / "model.safetensors").is_file()


def test_the_uploaded_workspace_holds_the_training_code_and_a_self_contained_dependency_file(
    platform: Platform,
) -> None:
    """The job runs `pip install -r <workspace>/requirements-remote.txt`: an `-r` include would point at a file the
    workspace does not have (the job's bootstrap would stop there)."""
    run_launcher(platform, "train", "--", "--dataset", upload_dataset(platform))
    (request,) = platform.create_requests
    (uri,) = [c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]
              if c["ChannelName"] == "sm_rf_user_ws"]  # fmt: skip
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3", region_name=REGION)
    objects = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
    (key,) = [o["Key"] for o in objects if o["Key"].endswith(".zip")]
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    with zipfile.ZipFile(io.BytesIO(body.read())) as archive:
        names = set(archive.namelist())
        requirements = archive.read("sagemaker_remote_function_workspace/requirements-remote.txt").decode()
    code = {name.removeprefix("sagemaker_remote_function_workspace/") for name in names if name.endswith(".py")}
    assert "training_assets/remote_train.py" in code
    assert any(name.endswith("train_sentiment.py") for name in code)
    assert all(name.startswith("training_assets/") for name in code), code
    lines = requirements.splitlines()
    assert not [line for line in lines if line.startswith(("-r", "--requirement"))]
    assert "sagemaker-core==2.27.0" in lines and any(line.startswith("transformers==") for line in lines)


def test_the_job_runs_one_process_per_gpu_under_torchrun(platform: Platform, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Issue 12.3: the job specification the SDK sends starts torchrun, which the SDK's bootstrap sizes to the GPUs."""
    from sagemaker.core.remote_function.runtime_environment import bootstrap_runtime_environment as bootstrap

    code, _ = run_launcher(platform, "train", "--", "--dataset", upload_dataset(platform))
    assert code == 0
    (request,) = platform.create_requests
    arguments = request["AlgorithmSpecification"]["ContainerArguments"]
    assert arguments[arguments.index("--distribution") + 1] == "torchrun"
    # One process per GPU, as the platform's instance facts count them (8 A100s on ml.p4d.24xlarge).
    assert arguments[arguments.index("--user_nproc_per_node") + 1] == "8"
    entrypoint = request["AlgorithmSpecification"]["ContainerEntrypoint"]
    (scripts,) = [c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]
                  if f"/opt/ml/input/data/{c['ChannelName']}/" in entrypoint[-1]]  # fmt: skip
    bucket, _, prefix = scripts.removeprefix("s3://").partition("/")
    driver = boto3.client("s3", region_name=REGION).get_object(Bucket=bucket, Key=f"{prefix}/job_driver.sh")
    assert "torchrun --nnodes $SM_HOST_COUNT --nproc_per_node $SM_NPROC_PER_NODE" in driver["Body"].read().decode()
    # The SDK's bootstrap, given the container arguments on a p4d (8 GPUs), sets SM_NPROC_PER_NODE to 8.
    monkeypatch.setattr(bootstrap, "num_gpus", lambda: 8)
    monkeypatch.setenv("TRAINING_JOB_NAME", request["TrainingJobName"])
    distribution = arguments[arguments.index("--distribution") + 1]
    nproc = arguments[arguments.index("--user_nproc_per_node") + 1]
    bootstrap.set_env({"current_host": "algo-1", "current_instance_type": "ml.p4d.24xlarge", "hosts": ["algo-1"],
                       "network_interface_name": "eth0"}, distribution=distribution, user_nproc_per_node=nproc,
                      output_file=str(tmp_path / "sm_training.env"))  # fmt: skip
    assert "export SM_NPROC_PER_NODE='8'" in (tmp_path / "sm_training.env").read_text().splitlines()


def test_sweep_through_remote_executor_within_the_launcher_policy(platform: Platform) -> None:
    dataset = upload_dataset(platform)
    code, out = run_launcher(platform, "sweep", "--learning-rates", "1e-5,3e-5", "--max-parallel-jobs", "2", "--",
                     "--dataset", dataset)  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines() if line.startswith('{"learning_rate"')]
    assert [row["learning_rate"] for row in rows] == [1e-5, 3e-5]  # best macro-F1 first
    assert platform.job_exit_codes == [0, 0]
    assert set(platform.refused(LAUNCHER)) <= TOLERATED_REFUSALS and platform.refused(JOB) == []
    assert len(platform.create_requests) == 2
    for request in platform.create_requests:
        arguments = request["AlgorithmSpecification"]["ContainerArguments"]
        assert arguments[arguments.index("--distribution") + 1] == "torchrun"
        assert "VolumeKmsKeyId" not in request["ResourceConfig"]


def test_an_ebs_only_override_gets_the_volume_key_and_sagemaker_accepts_the_request(platform: Platform) -> None:
    code, _ = run_launcher(
        platform, "--instance-type", "ml.p3.16xlarge", "train", "--", "--dataset", upload_dataset(platform)
    )
    assert code == 0
    (request,) = platform.create_requests
    assert request["ResourceConfig"]["InstanceType"] == "ml.p3.16xlarge"
    assert request["ResourceConfig"]["VolumeKmsKeyId"] == platform.key_arn


def test_without_the_callers_prefix_the_sdk_is_refused_at_its_first_upload(platform: Platform) -> None:
    """Why each caller's config.yaml holds its own S3 root: the shared root (jobs/) is nobody's to write."""
    config = yaml.safe_load(platform.config_path.read_text())
    modules = config["SageMaker"]["PythonSDK"]["Modules"]
    bucket = platform.buckets["RemoteJobs"]
    modules["RemoteFunction"]["S3RootUri"] = f"s3://{bucket}/jobs"
    modules["Session"]["DefaultS3ObjectKeyPrefix"] = "jobs"
    platform.config_path.write_text(yaml.safe_dump(config))
    with pytest.raises(ClientError, match="AccessDenied"):
        run_launcher(platform, "train", "--", "--dataset", upload_dataset(platform))
    refused = [r.call for r in platform.calls if not r.allowed and r.call.operation != "ListBuckets"]
    caller = f"jobs/{CALLER}/"
    keys = [c.params.get("Key", c.params.get("Prefix", "")) for c in refused]
    assert keys and all(key.startswith("jobs") and not key.startswith(caller) for key in keys), keys
    assert platform.create_requests == []


def test_another_caller_cannot_touch_a_callers_jobs_or_objects(platform: Platform) -> None:
    """Issue 41.1: B holds B's launcher policy. Every way B could read A's job environment, stop A's job, replace
    A's results (which A's client unpickles after checking only a SHA-256 stored next to them: sagemaker-core 2.27
    client.py, serialization.deserialize_obj_from_s3 without a key), tag a job, run a job as A's role or in A's
    security group, or pass a job off as A's is refused; the same requests as A, or as B on B's own job, are
    allowed."""
    run_launcher(platform, "train", "--", "--dataset", upload_dataset(platform))
    (request,) = platform.create_requests
    name, bucket = request["TrainingJobName"], platform.buckets["RemoteJobs"]
    prefix = f"jobs/{CALLER}/"
    results = f"{prefix}{name}/results/payload.pkl"
    sagemaker, s3 = boto3.client("sagemaker", region_name=REGION), boto3.client("s3", region_name=REGION)
    logs = boto3.client("logs", region_name=REGION)
    job_arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{name}"
    tags = [t for t in request["Tags"] if t["Key"] != "remote-job-owner"]
    b_owner = [*tags, {"Key": "remote-job-owner", "Value": OTHER_CALLER}]
    own = {**request, "TrainingJobName": f"{OTHER_CALLER}-own", "RoleArn": platform.other_role_arn, "Tags": b_owner,
           "VpcConfig": {**request["VpcConfig"], "SecurityGroupIds": [platform.other_security_group]}}  # fmt: skip
    (stream,) = [s["logStreamName"] for s in logs.describe_log_streams(
        logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix=name)["logStreams"]]  # fmt: skip
    attacks = {
        "describe A's job": lambda: sagemaker.describe_training_job(TrainingJobName=name),
        "stop A's job": lambda: sagemaker.stop_training_job(TrainingJobName=name),
        "read A's results": lambda: s3.get_object(Bucket=bucket, Key=results),
        "replace A's results": lambda: s3.put_object(Bucket=bucket, Key=results, Body=b"evil"),
        "list A's prefix": lambda: s3.list_objects_v2(Bucket=bucket, Prefix=prefix),
        "read A's job's logs": lambda: logs.get_log_events(logGroupName="/aws/sagemaker/TrainingJobs",
                                                           logStreamName=stream),
        "re-tag A's job as B's": lambda: sagemaker.add_tags(ResourceArn=job_arn, Tags=b_owner),
        "start a job named and tagged as A's": lambda: sagemaker.create_training_job(
            **{**request, "TrainingJobName": f"{CALLER}-by-b"}),
        "run B's job as A's role": lambda: sagemaker.create_training_job(
            **{**own, "TrainingJobName": f"{OTHER_CALLER}-as-a", "RoleArn": platform.role_arn}),
        "run B's job in A's security group": lambda: sagemaker.create_training_job(
            **{**own, "TrainingJobName": f"{OTHER_CALLER}-in-a", "VpcConfig": request["VpcConfig"]}),
    }  # fmt: skip
    for attack, call in attacks.items():
        with _as(OTHER_LAUNCHER), pytest.raises(ClientError, match="AccessDenied"):
            call()
            pytest.fail(f"B could {attack}")
    # The same describe as A, and B's own job (A's recorded request with B's name, role, group and tag) are allowed.
    with _as(LAUNCHER):
        sagemaker.describe_training_job(TrainingJobName=name)
        s3.get_object(Bucket=bucket, Key=results)
        with pytest.raises(ClientError, match="AccessDenied"):  # A's own job, re-tagged after its creation
            sagemaker.add_tags(ResourceArn=job_arn, Tags=request["Tags"])
    with _as(OTHER_LAUNCHER):
        sagemaker.create_training_job(**own)
        sagemaker.describe_training_job(TrainingJobName=own["TrainingJobName"])


def test_without_the_log_statement_waiting_for_the_job_fails(platform: Platform) -> None:
    """Why the launcher policy may read the training-job logs: job.wait() re-raises the refusal."""
    (policy,) = platform.policies[LAUNCHER]
    policy["Statement"] = [s for s in policy["Statement"] if s.get("Sid") != "ListTrainingJobLogStreams"]
    with pytest.raises(ClientError, match="AccessDenied"):
        run_launcher(platform, "train", "--", "--dataset", upload_dataset(platform))
    assert ("logs", "DescribeLogStreams") in platform.refused(LAUNCHER)


# ----------------------------------------------------------------------------------------- the evaluator itself


def _policy(*statements: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"Version": "2012-10-17", "Statement": list(statements)}]


def test_evaluator_matches_actions_resources_and_conditions() -> None:
    allow = _policy(
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": "arn:aws:s3:::b/jobs/*"},
        {"Effect": "Allow", "Action": "iam:PassRole", "Resource": "arn:aws:iam::1:role/r",
         "Condition": {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}},
        {"Effect": "Allow", "Action": "logs:Get*", "Resource": "arn:aws:logs:r:1:log-group:/g:*"},
    )  # fmt: skip
    assert is_allowed(allow, Request("s3:GetObject", "arn:aws:s3:::b/jobs/x/y"))
    assert is_allowed(allow, Request("S3:getobject", "arn:aws:s3:::b/jobs/x"))  # actions are case-insensitive
    assert not is_allowed(allow, Request("s3:GetObject", "arn:aws:s3:::b/other"))
    assert not is_allowed(allow, Request("s3:PutObject", "arn:aws:s3:::b/jobs/x"))
    assert is_allowed(allow, Request("iam:PassRole", "arn:aws:iam::1:role/r",
                                     {"iam:PassedToService": "sagemaker.amazonaws.com"}))  # fmt: skip
    assert not is_allowed(allow, Request("iam:PassRole", "arn:aws:iam::1:role/r",
                                         {"iam:PassedToService": "ec2.amazonaws.com"}))  # fmt: skip
    assert not is_allowed(allow, Request("iam:PassRole", "arn:aws:iam::1:role/r"))  # missing key: no match
    assert is_allowed(allow, Request("logs:GetLogEvents", "arn:aws:logs:r:1:log-group:/g:log-stream:j/algo-1"))
    assert not is_allowed(allow, Request("logs:GetLogEvents", "arn:aws:logs:r:1:log-group:/other:log-stream:s"))
    deny = _policy(*allow[0]["Statement"], {"Effect": "Deny", "Action": "s3:*", "Resource": "*"})
    assert not is_allowed(deny, Request("s3:GetObject", "arn:aws:s3:::b/jobs/x"))


def test_evaluator_fails_closed_on_what_it_does_not_model() -> None:
    with pytest.raises(Unsupported, match="NotPrincipal"):
        is_allowed([], Request("a:b", "r"), resource_policies=_policy(
            {"Effect": "Deny", "NotPrincipal": {"AWS": "x"}, "Action": "a:b", "Resource": "*"}))  # fmt: skip
    with pytest.raises(Unsupported, match="condition operator IpAddress"):
        is_allowed(_policy({"Effect": "Allow", "Action": "a:b", "Resource": "*",
                            "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}}),
                   Request("a:b", "r"))  # fmt: skip
    with pytest.raises(Unsupported, match="multivalued key aws:TagKeys"):
        is_allowed(_policy({"Effect": "Allow", "Action": "a:b", "Resource": "*",
                            "Condition": {"StringEquals": {"aws:TagKeys": "k"}}}),
                   Request("a:b", "r", {"aws:TagKeys": ["k"]}))  # fmt: skip
    with pytest.raises(Unsupported, match="no IAM mapping for sagemaker:CreateEndpoint"):
        requests_for(Call("sagemaker", "CreateEndpoint", {}, REGION, ACCOUNT), kms_encrypted_buckets={})


def test_calls_map_to_the_requests_aws_documents() -> None:
    put = Call("s3", "PutObject", {"Bucket": "b", "Key": "k", "SSEKMSKeyId": "arn:key"}, REGION, ACCOUNT)
    assert requests_for(put, kms_encrypted_buckets={"b": "arn:default"}) == [
        Request("s3:PutObject", "arn:aws:s3:::b/k", {"s3:x-amz-server-side-encryption-aws-kms-key-id": "arn:key"}),
        Request("kms:GenerateDataKey", "arn:key", {"kms:ViaService": f"s3.{REGION}.amazonaws.com"}),
    ]
    tags = [{"Key": "owner", "Value": "me"}]
    create = Call("sagemaker", "CreateTrainingJob", {
        "TrainingJobName": "j", "RoleArn": "arn:role", "Tags": tags,
        "ResourceConfig": {"InstanceType": "ml.p3.2xlarge", "VolumeKmsKeyId": "arn:v"},
        "OutputDataConfig": {"KmsKeyId": "arn:o"}, "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "VpcConfig": {"Subnets": ["s1"], "SecurityGroupIds": ["g1"]}, "EnableInterContainerTrafficEncryption": True,
    }, REGION, ACCOUNT)  # fmt: skip
    job_arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/j"
    tag_context = {"aws:RequestTag/owner": "me", "aws:TagKeys": ["owner"]}
    assert requests_for(create, kms_encrypted_buckets={}, principal={"aws:userid": "u"}) == [
        Request("sagemaker:CreateTrainingJob", job_arn, {
            "aws:userid": "u", "sagemaker:InstanceTypes": ["ml.p3.2xlarge"], "sagemaker:VpcSubnets": ["s1"],
            "sagemaker:VpcSecurityGroupIds": ["g1"], "sagemaker:VolumeKmsKey": "arn:v",
            "sagemaker:OutputKmsKey": "arn:o", "sagemaker:MaxRuntimeInSeconds": "3600",
            "sagemaker:InterContainerTrafficEncryption": "true", **tag_context}),
        Request("iam:PassRole", "arn:role", {"aws:userid": "u", "iam:PassedToService": "sagemaker.amazonaws.com"}),
        Request("sagemaker:AddTags", job_arn,
                {"aws:userid": "u", **tag_context, "sagemaker:TaggingAction": "CreateTrainingJob"}),
    ]  # fmt: skip
