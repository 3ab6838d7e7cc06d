"""``@remote`` on several instances and on managed spot, through the real sagemaker-core path against moto with the
harness of test_remote_sdk_moto.py: every API call checked against the launcher policy or the job role, the request
the SDK generates checked field by field, and the network the instances of a job need checked against the policies
and rules the templates hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest

from ops_review.iam_policy import Request, is_allowed, resolve
from proving_ground.iam_requests import Call, logical_id, requests_for, role_policies
from tests.stacks.security.exports import template_exports
from tests.training_assets import test_remote_sdk_moto as harness
from training_assets import remote_train

# The SDK's config validated once per distinct config (tests/conftest.py): ~1 CPU-s per job otherwise.
pytestmark = pytest.mark.usefixtures("sdk_config_validated_once")

platform = harness.platform  # the fixture: moto with the dev resources, every call checked
JOB, LAUNCHER = harness.JOB, harness.LAUNCHER
ACCOUNT, REGION = harness.ACCOUNT, harness.REGION


def _driver(request: dict[str, Any]) -> str:
    """The job driver script the SDK staged for the job (what SageMaker's container entry point runs)."""
    entrypoint = request["AlgorithmSpecification"]["ContainerEntrypoint"]
    (scripts,) = [c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]
                  if f"/opt/ml/input/data/{c['ChannelName']}/" in entrypoint[-1]]  # fmt: skip
    bucket, _, prefix = scripts.removeprefix("s3://").partition("/")
    body = boto3.client("s3", region_name=REGION).get_object(Bucket=bucket, Key=f"{prefix}/job_driver.sh")["Body"]
    return " ".join(body.read().decode().replace("\\\n", " ").split())  # continuations joined, spaces collapsed


def test_one_job_on_two_instances_runs_the_function_under_the_sdks_torchrun(
    platform: harness.Platform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sagemaker.core.remote_function.runtime_environment import bootstrap_runtime_environment as bootstrap

    dataset = harness.upload_dataset(platform)
    harness.run_launcher(platform, "--instance-count", "2", "train", "--", "--dataset", dataset, "--epochs", "1")
    assert set(platform.refused(LAUNCHER)) <= harness.TOLERATED_REFUSALS and platform.refused(JOB) == []
    assert platform.job_exit_codes == [0]
    (request,) = platform.create_requests
    assert request["ResourceConfig"]["InstanceCount"] == 2
    arguments = request["AlgorithmSpecification"]["ContainerArguments"]
    assert arguments[arguments.index("--distribution") + 1] == "torchrun"
    assert arguments[arguments.index("--user_nproc_per_node") + 1] == "8"  # 8 A100s per ml.p4d.24xlarge (facts)
    # Every instance gets every input (the SDK's torchrun request), and the jobs' own security group.
    assert {c["DataSource"]["S3DataSource"]["S3DataDistributionType"] for c in request["InputDataConfig"]} == {
        "FullyReplicated"
    }
    assert request["VpcConfig"]["SecurityGroupIds"] == [platform.security_group]
    assert ("torchrun --nnodes $SM_HOST_COUNT --nproc_per_node $SM_NPROC_PER_NODE --master_addr $SM_MASTER_ADDR "
            "--master_port $SM_MASTER_PORT --node_rank $SM_CURRENT_HOST_RANK") in _driver(request)  # fmt: skip
    # What the SDK's bootstrap exports on the second instance: two nodes, this one of rank 1, 8 processes each,
    # all meeting at algo-1. Every process runs the same function: run_training_job, as on one instance.
    monkeypatch.setenv("TRAINING_JOB_NAME", request["TrainingJobName"])
    monkeypatch.setattr(bootstrap, "num_gpus", lambda: 8)
    nproc = arguments[arguments.index("--user_nproc_per_node") + 1]
    bootstrap.set_env({"current_host": "algo-2", "current_instance_type": "ml.p4d.24xlarge",
                       "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0"}, distribution="torchrun",
                      user_nproc_per_node=nproc, output_file=str(tmp_path / "sm_training.env"))  # fmt: skip
    exported = (tmp_path / "sm_training.env").read_text().splitlines()
    for line in ("export SM_HOST_COUNT='2'", "export SM_CURRENT_HOST_RANK='1'", "export SM_MASTER_ADDR='algo-1'",
                 "export SM_NPROC_PER_NODE='8'"):  # fmt: skip
        assert line in exported, line


def test_the_instances_of_a_job_reach_each_other_and_sagemaker_may_attach_them(templates) -> None:
    """The group config.yaml names admits all traffic from itself (and sends it), as SageMaker's VPC guide asks for
    distributed training and EFA; the job role may create the job's interfaces in it, in the platform's VPC, and the
    launcher may start jobs in it and in no other group (not the endpoints' workload group)."""
    foundation, training = templates["dev"]["Foundation"], templates["dev"]["Training"]
    suffix = harness.CALLER.capitalize()  # the caller's own group, role and config
    group_id = logical_id(foundation, "AWS::EC2::SecurityGroup", f"RemoteJobsSecurityGroup{suffix}")
    self_ref = {"Fn::GetAtt": [group_id, "GroupId"]}
    rules = [r["Properties"] for r in foundation["Resources"].values()
             if r["Type"] in ("AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress")
             and r["Properties"]["GroupId"] == self_ref]  # fmt: skip
    assert [(rule.get("SourceSecurityGroupId"), rule.get("DestinationSecurityGroupId"), rule["IpProtocol"])
            for rule in rules] == [(self_ref, None, "-1"), (None, self_ref, "-1")]  # fmt: skip

    role_id = logical_id(foundation, "AWS::IAM::Role", f"RemoteJobRole{suffix}")
    vpc_id = logical_id(foundation, "AWS::EC2::VPC", "Vpc")
    workload_id = logical_id(foundation, "AWS::EC2::SecurityGroup", "WorkloadSecurityGroup")
    other_suffix = harness.OTHER_CALLER.capitalize()
    other_group_id = logical_id(foundation, "AWS::EC2::SecurityGroup", f"RemoteJobsSecurityGroup{other_suffix}")

    class Refs(dict):  # type: ignore[type-arg]
        def __missing__(self, key: str) -> str:
            return f"<{key}>"

    refs = Refs({"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT, vpc_id: "vpc-1",
                 f"{group_id}.GroupId": "sg-jobs", f"{workload_id}.GroupId": "sg-workload",
                 f"{other_group_id}.GroupId": "sg-other-caller"})  # fmt: skip
    (parameter,) = [r for name, r in training["Resources"].items() if r["Type"] == "AWS::SSM::Parameter"
                    and name.startswith(f"RemoteFunctionConfig{suffix}")]  # fmt: skip
    config = resolve(parameter["Properties"]["Value"]["Fn::Sub"][1], refs=refs,
                     exports=template_exports(foundation, refs))  # fmt: skip
    assert config["SecurityGroupId"] == "sg-jobs"
    policies = role_policies(foundation, role_id, refs)
    subnet = logical_id(foundation, "AWS::EC2::Subnet", "VpcPrivateSubnet1Subnet")
    in_vpc = {"ec2:Vpc": f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/vpc-1"}
    arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}"
    for resource in (f"{arn}:subnet/<{subnet}>", f"{arn}:security-group/sg-jobs", f"{arn}:network-interface/*"):
        assert is_allowed(policies, Request("ec2:CreateNetworkInterface", resource, in_vpc)), resource
    for group in ("sg-other", "sg-workload", "sg-other-caller"):
        assert not is_allowed(policies, Request("ec2:CreateNetworkInterface", f"{arn}:security-group/{group}", in_vpc))
    assert not is_allowed(policies, Request("ec2:CreateNetworkInterface", f"{arn}:security-group/sg-jobs",
                                            {"ec2:Vpc": f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/vpc-2"}))  # fmt: skip


def _record_train_configs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The training configs the job's function is called with (the training itself stubbed)."""
    seen: list[Any] = []

    def recording_train(config: Any) -> dict[str, Any]:
        seen.append(config)
        return harness.stub_train(config)

    monkeypatch.setattr(remote_train, "train", recording_train)
    return seen


def test_a_spot_job_checkpoints_to_the_callers_prefix_and_resumes_there(
    platform: harness.Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _record_train_configs(monkeypatch)
    dataset = harness.upload_dataset(platform)
    harness.run_launcher(platform, "--spot", "--run-id", "tweets-7", "train", "--", "--dataset", dataset,
                 "--checkpoint-steps", "50")  # fmt: skip
    assert set(platform.refused(LAUNCHER)) <= harness.TOLERATED_REFUSALS and platform.refused(JOB) == []
    (request,) = platform.create_requests
    caller = harness.CALLER
    uri = f"s3://{platform.buckets['RemoteJobs']}/jobs/{caller}/checkpoints/tweets-7/"
    assert request["CheckpointConfig"] == {"LocalPath": "/opt/ml/checkpoints/", "S3Uri": uri}
    assert request["EnableManagedSpotTraining"] is True
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 24 * 3600, "MaxWaitTimeInSeconds": 48 * 3600}
    # Inside the job the function checkpoints where SageMaker syncs from (and restores to, after an interruption).
    (config,) = seen
    assert (config.checkpoint_dir, config.checkpoint_steps) == ("/opt/ml/checkpoints/", 50)
    # TorchInductor's cache beside the checkpoints: SageMaker restores it with them.
    assert config.compile_cache_dir == "/opt/ml/checkpoints/compile-cache"
    # SageMaker copies the checkpoints and the cache with the job's role, both ways: it may, with the platform key.
    encrypted = {bucket: platform.key_arn for bucket in platform.buckets.values()}
    for key in (f"jobs/{caller}/checkpoints/tweets-7/checkpoint-50/model.safetensors",
                f"jobs/{caller}/checkpoints/tweets-7/compile-cache/triton/0/kernel.cubin"):  # fmt: skip
        for action in ("PutObject", "GetObject"):
            call = Call("s3", action, {"Bucket": platform.buckets["RemoteJobs"], "Key": key}, REGION, ACCOUNT)
            for request_ in requests_for(call, kms_encrypted_buckets=encrypted, principal=harness.IDENTITIES[JOB]):
                assert is_allowed(platform.policies[JOB], request_), request_


@pytest.mark.parametrize("compiles", [True, False])
def test_a_job_that_compiles_keeps_its_compile_cache_where_sagemaker_restores_it(
    platform: harness.Platform, monkeypatch: pytest.MonkeyPatch, compiles: bool
) -> None:
    """Without checkpoints, a job that compiles (the GPU default) still gets a checkpoint location, for
    TorchInductor's cache; one that does not compile gets none."""
    seen = _record_train_configs(monkeypatch)
    dataset = harness.upload_dataset(platform)
    flags = [] if compiles else ["--no-torch-compile"]
    harness.run_launcher(platform, "--run-id", "tweets-8", "train", "--", "--dataset", dataset, *flags)
    assert set(platform.refused(LAUNCHER)) <= harness.TOLERATED_REFUSALS and platform.refused(JOB) == []
    request = platform.create_requests[-1]
    (config,) = seen
    if compiles:
        uri = f"s3://{platform.buckets['RemoteJobs']}/jobs/{harness.CALLER}/checkpoints/tweets-8/"
        assert request["CheckpointConfig"] == {"LocalPath": "/opt/ml/checkpoints/", "S3Uri": uri}
        assert (config.compile_cache_dir, config.checkpoint_steps) == ("/opt/ml/checkpoints/compile-cache", 0)
    else:
        assert "CheckpointConfig" not in request and config.compile_cache_dir is None


def test_spot_without_checkpoints_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        remote_train.parse(["--spot", "train", "--", "--epochs", "1"])
    assert exit_.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith("--spot needs checkpoints (-- --checkpoint-steps N): an interrupted job resumes from them")
    )
    args, _ = remote_train.parse(["--max-runtime-hours", "3", "--spot", "train", "--", "--checkpoint-steps", "9"])
    assert (args.max_wait_hours, args.run_id.startswith("sentiment-"), args.instance_count) == (6, True, 1)
