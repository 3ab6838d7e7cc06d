"""The rehearsal's platform steps: synth, the call gate, preflight, deploy (with CloudFormation's and Service
Quotas' stand-ins), and destroy and clean up.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ops_review.review import load_assembly
from proving_ground.rehearsal.aws_calls import (
    Gate,
    Principal,
    install,
    start_server,
)
from proving_ground.rehearsal.deployment import Deployment
from proving_ground.rehearsal.ec2_host import install_host_tools, shared_aws_cli
from proving_ground.rehearsal.journey import (
    ACCOUNT,
    AWS_SERVICE,
    DEPLOYER,
    ENDPOINT_ROLE,
    HOST_CLI_SERVICES,
    INSTANCE,
    KEYS,
    LAUNCHER,
    MME_CLIENT,
    OPERATOR,
    REMOTE_JOB,
    REMOTE_LAUNCHER,
    RUN_LAUNCHER,
    SERVING_DIGEST,
    SERVING_IMAGE,
    RehearsalBase,
    StepFailed,
    make_principal,
)
from stacks.image_names import image_parameter_name


class PlatformSteps(RehearsalBase):
    def synth(self) -> str:
        stacks = [s for s in load_assembly(self.assembly) if s.environment == self.environment]
        if not stacks:
            raise StepFailed(f"{self.assembly} has no stacks of environment {self.environment!r}")
        self.stacks = {s.stack: s for s in stacks}
        missing = {"Foundation", "Training"} - set(self.stacks)
        if missing:
            raise StepFailed(f"{self.environment} has no {', '.join(sorted(missing))} stack in {self.assembly}")
        return f"{len(stacks)} stacks: {', '.join(sorted(self.stacks))}"

    def _open_gate(self) -> None:
        """The call gate, with the principals that have no synthesized policy; deploy adds the others."""
        aws_cli = shared_aws_cli()
        # The nodes' and the operator's `aws` calls, forked from one server that imported the CLI once.
        server = _call_server(aws_cli, self._base_environment())
        self.bin_dir = install_host_tools(self.work / "bin", aws_cli, gated=True, aws_server=server)
        unchecked = [
            make_principal(name, KEYS[name], None, f"arn:aws:iam::{ACCOUNT}:role/{name.split()[0]}", "rehearsal")
            for name in (DEPLOYER, OPERATOR, AWS_SERVICE)
        ]
        self.gate = Gate(ACCOUNT, self.region, self.work / "calls.jsonl", unchecked)
        self.gate.save(self.gate_file)
        os.environ["AWS_DEFAULT_REGION"] = self.region
        stand_ins = {**self._quota_stand_ins(), ("cloudformation", "ListStackResources"): self._stack_resources}
        self.uninstall = install(self.gate, stand_ins=stand_ins, resource_tags=self._tags)

    def preflight(self) -> str:
        from ops_review import preflight

        self._open_gate()
        self._publish_serving_image()
        out, err = io.StringIO(), io.StringIO()
        with self.acting_as(OPERATOR), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = preflight.main(["-c", f"env={self.environment}", "--cdk-out", str(self.assembly)])
        lines = out.getvalue().strip().splitlines()
        if code != 0:
            blockers = [line for line in lines if line.startswith("BLOCKER")]
            raise StepFailed("; ".join(blockers) or err.getvalue().strip())
        warnings = [line.split(":", 1)[0].removeprefix("WARNING").strip() for line in lines if line.startswith("WARN")]
        return f"{lines[-1]}" + (f" ({'; '.join(warnings)})" if warnings else "")

    def _publish_serving_image(self) -> None:
        """The README's first-deploy step 2, by hand: the serving image (an image index of one arm64 platform) in
        the tooling account's repository, whose policy lets this account pull, and its digest URI in the parameter
        the Graviton endpoint resolves when it deploys. Preflight and check-images read what is published here."""
        account, repository = SERVING_DIGEST.split(".", 1)[0], SERVING_DIGEST.split("/", 1)[1].split("@")[0]
        ecr = self.client("ecr", OPERATOR)
        ecr.create_repository(registryId=account, repositoryName=repository)
        actions = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
        pull = {"Version": "2012-10-17", "Statement": [{"Sid": "EnvironmentAccountsPull", "Effect": "Allow",
                "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}, "Action": actions}]}  # fmt: skip
        ecr.set_repository_policy(registryId=account, repositoryName=repository, policyText=json.dumps(pull))
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1, "digest": "sha256:" + "ab" * 32,
             "platform": {"architecture": "arm64", "os": "linux"}}]}  # fmt: skip
        ecr.put_image(registryId=account, repositoryName=repository, imageManifest=json.dumps(index), imageTag="v1")
        (image,) = ecr.batch_get_image(registryId=account, repositoryName=repository,
                                       imageIds=[{"imageTag": "v1"}])["images"]  # fmt: skip
        self.serving_image_uri = SERVING_DIGEST.split("@")[0] + "@" + image["imageId"]["imageDigest"]
        name = image_parameter_name(self.settings().tags.project, SERVING_IMAGE)
        self.client("ssm", OPERATOR).put_parameter(Name=name, Type="String", Value=self.serving_image_uri)

    def _stack_resources(self, params: dict[str, Any]) -> dict[str, Any]:
        """ListStackResources from what the deployment recorded (live stacks by name, deleted ones by id, as
        CloudFormation answers for 90 days): moto's, for a deleted stack, resolves its template's imports again
        and fails once the exporting stack is gone."""
        from botocore.exceptions import ClientError

        asked = params["StackName"]
        for deployed in self.deployment.deployed.values() if self.deployment else []:
            name = deployed.stack.stack_name
            gone = deployed.status == "DELETE_COMPLETE"
            if (asked == name and not gone) or asked.startswith(f"arn:aws:cloudformation:{self.region}:{ACCOUNT}:"
                                                                f"stack/{name}/"):  # fmt: skip
                status = "DELETE_COMPLETE" if gone else "CREATE_COMPLETE"
                return {"StackResourceSummaries": [
                    {"LogicalResourceId": logical, "PhysicalResourceId": physical, "ResourceType": kind,
                     "LastUpdatedTimestamp": "2026-12-01T00:00:00Z", "ResourceStatus": status}
                    for logical, kind, physical in deployed.resources]}  # fmt: skip
        error = {"Error": {"Code": "ValidationError", "Message": f"Stack with id {params['StackName']} does not exist"}}
        raise ClientError(error, "ListStackResources")

    def _quota_stand_ins(self) -> dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]]:
        """Service Quotas (moto knows only the vpc service's): the rehearsal's account has raised every quota the
        templates use to 1000 (SageMaker quotas by name, the EC2 vCPU quotas by code)."""
        names = set()
        for stack in self.stacks.values():
            for resource in stack.template["Resources"].values():
                props = resource.get("Properties", {})
                if resource["Type"] == "AWS::SageMaker::EndpointConfig":
                    names |= {f"{v['InstanceType']} for endpoint usage" for v in props["ProductionVariants"]}
                if resource["Type"] == "AWS::SSM::Parameter":
                    found = re.findall(r"InstanceType: (ml\.[\w.]+)", json.dumps(props))
                    names |= {f"{t} for training job usage" for t in found}

        def quota(service: str, code: str, name: str) -> dict[str, Any]:
            return {"ServiceCode": service, "QuotaCode": code, "QuotaName": name, "Value": 1000.0}

        def one(params: dict[str, Any]) -> dict[str, Any]:
            return {"Quota": quota(params["ServiceCode"], params["QuotaCode"], params["QuotaCode"])}

        def listed(params: dict[str, Any]) -> dict[str, Any]:
            ordered = sorted(names) if params["ServiceCode"] == "sagemaker" else []
            return {"Quotas": [quota("sagemaker", f"L-{i:08X}", name) for i, name in enumerate(ordered)]}

        def account_attributes(params: dict[str, Any]) -> dict[str, Any]:
            # Raised like the quotas above: cdk.json's three environments share one account (no account set) and
            # their NAT gateways need six Elastic IPs against a new account's five (preflight's test shows the
            # blocker); the rehearsal plays an account where the increase was granted.
            return {"AccountAttributes": [{"AttributeName": "vpc-max-elastic-ips",
                                           "AttributeValues": [{"AttributeValue": "1000"}]}]}  # fmt: skip

        def endpoint_services(params: dict[str, Any]) -> dict[str, Any]:
            # moto's answer loads every moto backend (and their extras); here every service is offered in every
            # zone of the region, as EC2 answers for the platform's services in us-west-2's zones a-d.
            zones = [f"{self.region}{zone}" for zone in "abcd"]
            names = params.get("ServiceNames", [])
            return {"ServiceNames": names, "ServiceDetails": [
                {"ServiceName": name, "AvailabilityZones": zones, "ServiceType": [{"ServiceType": "Interface"}]}
                for name in names]}  # fmt: skip

        return {
            ("service-quotas", "GetServiceQuota"): one,
            ("service-quotas", "ListServiceQuotas"): listed,
            ("ec2", "DescribeAccountAttributes"): account_attributes,
            ("ec2", "DescribeVpcEndpointServices"): endpoint_services,
        }

    def deploy(self) -> str:
        assert self.gate is not None
        region = self.region
        self.deployment = deployment = Deployment(self.stacks, self.client, region)
        deployment.custom_deleters["Custom::EniReleaseWait"] = self._eni_release_wait
        deployment.after_created["AWS::SageMaker::Endpoint"] = self._endpoint_interfaces
        self._bootstrap()
        for stack_id in ("Foundation", "Training", "MultiModelEndpoint"):
            if stack_id in self.stacks:
                deployment.deploy(stack_id)

        keys = KEYS

        def role(stack_id: str, prefix: str, name: str, session: str) -> Principal:
            role_name = deployment.role_name(stack_id, prefix)
            arn = f"arn:aws:iam::{ACCOUNT}:role/{role_name}"
            policies, tags = deployment.role_policies(role_name), deployment.role_tags(role_name)
            return make_principal(name, keys[name], policies, arn, session, tags)

        def person(stack_id: str, prefix: str, name: str, session: str) -> Principal:
            arn = f"arn:aws:iam::{ACCOUNT}:role/{name.replace(' ', '-').replace('@', '')}"
            return make_principal(name, keys[name], [deployment.managed_policy(stack_id, prefix)], arn, session)

        checked = [
            person("Training", "TrainingLauncherPolicy", LAUNCHER, "alice@example.com"),
            role("Training", "TrainingLauncherRole", RUN_LAUNCHER, "TrainingLauncherFunction"),
            role("Foundation", "TrainingInstanceRole", INSTANCE, "i-instance"),
            role("Foundation", "EndpointExecutionRole", ENDPOINT_ROLE, "SageMaker"),
            # The environment's first @remote caller (training.remote_callers): its launcher policy and job role.
            person(
                "Foundation",
                f"RemoteJobLauncherPolicy{self.remote_caller_suffix()}",
                REMOTE_LAUNCHER,
                "alice@example.com",
            ),
            role("Foundation", f"RemoteJobRole{self.remote_caller_suffix()}", REMOTE_JOB, "SageMaker"),
        ]
        if "MultiModelEndpoint" in self.stacks:
            checked.append(person("MultiModelEndpoint", "InvokePolicy", MME_CLIENT, "app"))
        self.gate.principals += checked
        self.gate.kms_encrypted_buckets = dict(deployment.encrypted_buckets)
        self.gate.bucket_policies, self.gate.key_policies = deployment.resource_policies()
        self.gate.topic_policies, self.gate.endpoint_policies = deployment.topic_and_endpoint_policies()
        for principal in self.gate.principals:
            principal.in_vpc = principal.name in (INSTANCE, ENDPOINT_ROLE, REMOTE_JOB)
        self.gate.launch_templates = {k: {n: v for n, v in t.items() if n != "user_data"}
                                      for k, t in deployment.launch_templates.items()}  # fmt: skip
        self.gate.save(self.gate_file)
        stacks = ", ".join(d.stack.stack_name for d in deployment.deployed.values())
        return f"{stacks}; code assets published; {len(checked)} principals with synthesized policies"

    def _tags(self, arn: str) -> dict[str, str]:
        """A resource's tags as the service holds them (IAM's own lookup for aws:ResourceTag; not checked)."""
        from botocore.exceptions import ClientError

        try:
            tags = self.client("sagemaker", AWS_SERVICE).list_tags(ResourceArn=arn)["Tags"]
        except ClientError:
            return {}
        return {t["Key"]: t["Value"] for t in tags}

    def _bootstrap(self) -> None:
        """What `cdk bootstrap` leaves (the assets bucket, the bootstrap version parameter every template's
        BootstrapVersion reads), then the assembly's file assets zipped into the bucket, as `cdk deploy` publishes
        them before it deploys."""
        s3 = self.client("s3")
        bucket = f"cdk-hnb659fds-assets-{ACCOUNT}-{self.region}"
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": self.region})
        self.client("ssm").put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value="30", Type="String")
        for manifest in (self.assembly / f"assembly-{self.environment}").glob("*.assets.json"):
            for asset_hash, asset in json.loads(manifest.read_text())["files"].items():
                if asset["source"].get("packaging") != "zip":
                    continue
                source = (manifest.parent / asset["source"]["path"]).resolve()
                buffer = io.BytesIO()
                with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                    for path in sorted(source.rglob("*")):
                        if path.is_file():
                            archive.write(path, path.relative_to(source).as_posix())
                s3.put_object(Bucket=bucket, Key=f"{asset_hash}.zip", Body=buffer.getvalue())

    def _endpoint_interfaces(self, deployment: Deployment, stack_id: str, logical: str) -> None:
        """SageMaker, starting an endpoint whose model has a VpcConfig, puts a network interface in each of its
        subnets, in its security groups (requester-managed: the account cannot delete them)."""
        resources = self.stacks[stack_id].template["Resources"]
        models = [r for r in resources.values() if r["Type"] == "AWS::SageMaker::Model"]
        vpc = [
            deployment.resolve(stack_id, m["Properties"]["VpcConfig"]) for m in models if "VpcConfig" in m["Properties"]
        ]
        name = deployment.resolve(stack_id, resources[logical]["Properties"]["EndpointName"])
        ec2 = self.client("ec2", AWS_SERVICE)
        for config in vpc:
            for subnet in config["Subnets"]:
                interface = ec2.create_network_interface(SubnetId=subnet, Groups=config["SecurityGroupIds"],
                                                         Description=f"SageMaker endpoint {name}")  # fmt: skip
                self.endpoint_interfaces.setdefault(str(name).lower(), []).append(
                    interface["NetworkInterface"]["NetworkInterfaceId"]
                )

    def _eni_release_wait(self, deployment: Deployment, stack_id: str, logical: str) -> None:
        """Custom::EniReleaseWait's Delete, its handler's wait run as its role: SageMaker releases a deleted
        endpoint's interfaces a while after DeleteEndpoint returns (played: a second later, by the AWS service)."""
        from stacks.components.eni_release_wait import handler

        assert self.gate is not None
        live = {e["EndpointName"].lower() for e in self.client("sagemaker", AWS_SERVICE).list_endpoints()["Endpoints"]}
        gone = [eni for name, enis in self.endpoint_interfaces.items() if name not in live for eni in enis]
        for name in [n for n in self.endpoint_interfaces if n not in live]:
            del self.endpoint_interfaces[name]
        ec2 = self.client("ec2", AWS_SERVICE)
        release = threading.Timer(1.0, lambda: [ec2.delete_network_interface(NetworkInterfaceId=e) for e in gone])
        release.start()
        role = deployment.role_name(stack_id, "EniReleaseWaitRole")
        name = f"ENI release wait ({self.stacks[stack_id].stack})"
        if name not in {p.name for p in self.gate.principals}:
            key, arn = f"eniwait{len(self.gate.principals):05d}", f"arn:aws:iam::{ACCOUNT}:role/{role}"
            policies = deployment.role_policies(role)
            tags = deployment.role_tags(role)
            self.gate.principals.append(make_principal(name, key, policies, arn, "eni-release-wait", tags))
            self.gate.save(self.gate_file)
        properties = deployment.resolve(stack_id, self.stacks[stack_id].template["Resources"][logical]["Properties"])
        try:
            said = handler.wait_for_release(
                self.client("ec2", name), self.client("sagemaker", name), properties["SecurityGroupIds"],
                properties.get("SharedWithEndpoints", []), budget_seconds=60, poll_seconds=0.25,
            )  # fmt: skip
        finally:
            release.join()
        self.destroyed.append(f"{self.stacks[stack_id].stack}: {said}")

    def destroy_and_clean_up(self) -> str:
        from ops_review import cleanup

        assert self.deployment is not None
        for stack_id in ("GravitonEndpoint", "MultiModelEndpoint", "Training", "Foundation"):
            if stack_id in self.deployment.deployed:
                kept = self.deployment.destroy(stack_id)
                if kept:
                    self.destroyed.append(f"{self.stacks[stack_id].stack} retains {', '.join(kept)}")
        arguments = ["--env", self.environment, "--cdk-out", str(self.assembly), "--region", self.region]
        outputs = []
        for dry_run in (["--dry-run"], []):  # docs/operations.md: list first, then delete
            out, err = io.StringIO(), io.StringIO()
            with self.acting_as(OPERATOR), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = cleanup.main([*arguments, *dry_run])
            if code != 0:
                raise StepFailed(f"cleanup {' '.join(dry_run)} exited {code}: {err.getvalue().strip()}")
            outputs.append(out.getvalue().strip().splitlines())
        listed, done = outputs
        alive = [line for line in listed if "still" in line]
        if alive:
            raise StepFailed("; ".join(alive))
        destroyed = "; ".join(self.destroyed)
        return f"{destroyed}; cleanup listed {len(listed)}: {'; '.join(listed)}; {done[-1] if done else ''}"


_call_servers: dict[Path, Path] = {}  # unpacked AWS CLI -> the socket of this process's call server
_call_servers_lock = threading.Lock()


def _call_server(aws_cli: Path, environment: dict[str, str]) -> Path:
    """The socket of this process's aws call server (proving_ground/rehearsal/aws_calls.py ``serve``), started by the
    first rehearsal
    and stopped when the process ends (or, killed, by itself): the rehearsals of one process share it, since each
    call brings its caller's environment (gate file, step, credentials, endpoint) and working folder, and each
    rehearsal after the first saves the server's start (the CLI imported, its data parsed: ~0.9 CPU-s)."""
    import atexit

    with _call_servers_lock:
        if aws_cli not in _call_servers:
            folder = Path(tempfile.mkdtemp(prefix="rehearsal-aws-"))  # short: a socket's path has 107 bytes at most
            socket = folder / "aws.sock"
            stop = start_server(socket, aws_cli, environment, folder / "aws.log", services=HOST_CLI_SERVICES)
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            atexit.register(stop)  # atexit runs the last registered first: the server stops, then its folder goes
            _call_servers[aws_cli] = socket
        return _call_servers[aws_cli]
