"""The rehearsal's training steps: the EC2 training run (the launch template's user data run for real) and
the @remote job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

from ops_review.iam_policy import Request, is_allowed
from proving_ground.rehearsal.aws_calls import Principal, Record, _write
from proving_ground.rehearsal.journey import (
    AWS_SERVICE,
    INSTANCE,
    LAUNCHER,
    OPERATOR,
    REMOTE_IMAGE,
    REMOTE_LAUNCHER,
    RUN_LAUNCHER,
    RehearsalBase,
    StepFailed,
)
from stacks.components.training_launcher import HANDLER

LINEAGE = Path(__file__).resolve().parents[2] / "training_assets" / "instance" / "run_lineage.py"


def lambda_handler(folder: Path, name: str) -> Any:
    """A platform function's handler module (stdlib + boto3) from its asset folder, as Lambda loads it."""
    spec = importlib.util.spec_from_file_location(name, folder / "handler.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def launcher_handler() -> Any:
    """The training launcher's handler."""
    return lambda_handler(HANDLER, "run_launcher_handler")


class TrainingSteps(RehearsalBase):
    def ec2_run(self) -> str:
        """The person asks the platform's launcher for a run (lambda:InvokeFunction, checked against their policy);
        the launcher's handler, run here as its role, launches from the template (every call through the gate)."""
        assert self.deployment is not None and self.gate is not None
        resources = self.deployment.stacks["Training"].template["Resources"]
        (function_id,) = [name for name, resource in resources.items() if resource["Type"] == "AWS::Lambda::Function"
                          and name.startswith("TrainingLauncherFunction")]  # fmt: skip
        function_arn = str(self.deployment.deployed["Training"].refs[f"{function_id}.Arn"])
        person = self.gate.principal(LAUNCHER)
        invoke = Request("lambda:InvokeFunction", function_arn, dict(person.identity))
        allowed = is_allowed(person.policies or [], invoke)
        record = Record("EC2 training run", LAUNCHER, "lambda", "Invoke", function_id,
                        [(invoke.action, invoke.resource)], allowed, None if allowed else "AccessDenied")  # fmt: skip
        _write(self.gate, record)
        if not allowed:
            raise StepFailed(f"{LAUNCHER} may not invoke the training launcher {function_arn}")
        handler = launcher_handler()
        function = resources[function_id]["Properties"]
        variables = self.deployment.resolve("Training", function["Environment"]["Variables"])
        event = {"run_name": "rehearsal-run", "nodes": int(variables["MAX_NODES"])}
        try:
            settings = handler.Settings.from_environment(variables)
            started = handler.launch(self.client("ec2", RUN_LAUNCHER), self.client("s3", RUN_LAUNCHER), event, settings)
        except handler.Refused as refusal:
            raise StepFailed(f"the launcher refused {event}: {refusal}") from None
        ec2 = self.client("ec2", OPERATOR)
        (reservation,) = ec2.describe_instances(InstanceIds=started["instance_ids"])["Reservations"]
        instances = sorted(reservation["Instances"], key=lambda i: started["instance_ids"].index(i["InstanceId"]))
        template = self.deployment.launch_templates[variables["LAUNCH_TEMPLATE_ID"]]
        # Each instance acts as its own session of the instance role (aws:userid <role id>:<instance id>).
        sessions = {i["InstanceId"]: self._instance_session(settings.instance_role_id, i["InstanceId"])
                    for i in instances}  # fmt: skip
        self.gate.save(self.gate_file)
        # The nodes boot together: each finds the others through the reservation while they run.
        nodes = [self._start_user_data(template["user_data"], reservation["ReservationId"], instance,
                                       sessions[instance["InstanceId"]]) for instance in instances]  # fmt: skip
        failed = []
        for node, (instance, process) in enumerate(zip(instances, nodes, strict=True)):
            if process.wait(timeout=600) != 0:
                output = (self.work / "instances" / instance["InstanceId"] / "user-data.out").read_text()
                tail = "\n".join(output.strip().splitlines()[-6:])
                failed.append(f"node {node} ({instance['InstanceId']}): user data exited {process.returncode}:\n{tail}")
        if failed:
            raise StepFailed("\n".join(failed))
        # The run's candidate as the operator finds it to promote it: in the folder of a writer its records name.
        run = f"s3://{self.stack_output('Foundation', 'ArtifactsBucketName')}/training-output/{started['run_id']}/"
        found = self.shell(OPERATOR, [sys.executable, str(LINEAGE), "--run", run, "candidate"], cwd=self.work)
        if found.returncode != 0:
            raise StepFailed(f"the run left no candidate under {run}: {found.stderr.strip()}")
        states = {
            i["InstanceId"]: i["State"]["Name"]
            for r in ec2.describe_instances(InstanceIds=[i["InstanceId"] for i in instances])["Reservations"]
            for i in r["Instances"]
        }
        if set(states.values()) != {"terminated"}:
            raise StepFailed(f"instances still alive after the run: {states}")
        self.facts["run_model"] = found.stdout.strip()
        return f"{len(instances)} node(s); {self.facts['run_model']}; instances terminated"

    def _instance_session(self, role_id: str, instance_id: str) -> Principal:
        """The instance role's session on one instance, a principal of the gate under the role's name (its records
        read "training instance role"): its own keys, aws:userid ``<role id>:<instance id>`` (IAM User Guide, policy
        variables: a role assigned to an EC2 instance)."""
        assert self.gate is not None
        role = next(p for p in self.gate.principals if p.name == INSTANCE)  # the role's own entry comes first
        session = dataclasses.replace(
            role, access_key=f"AKIA{instance_id[2:].upper():0<16}",
            identity={**role.identity, "aws:userid": f"{role_id}:{instance_id}"},
        )  # fmt: skip
        self.gate.principals.append(session)
        return session

    def _start_user_data(
        self, user_data: str, reservation: str, instance: dict[str, Any], session: Principal
    ) -> subprocess.Popen[bytes]:
        """The instance boots: its user data runs with bash, as its role's session, in a folder of its own."""
        assert self.gate is not None
        host = self.work / "instances" / instance["InstanceId"]
        host.mkdir(parents=True)
        # The instance's fixed paths, moved under this node's folder.
        script = user_data.replace("/opt/sentiment-training", str(host / "opt" / "sentiment-training")).replace(
            "/var/log/", f"{host}/var-log-"
        )
        (host / "user-data.sh").write_text(script)
        # The instance's EFA devices (one per network card of a p4d.24xlarge), which launch_training.sh passes through.
        devices = host / "dev-infiniband"
        devices.mkdir()
        for card in range(4):
            (devices / f"uverbs{card}").touch()
        service = self.gate.principal(AWS_SERVICE)
        env = {
            **self._base_environment(),
            **session.environment(),
            "IMDS_instance_id": instance["InstanceId"],
            "IPTABLES_RULES": str(host / "iptables.rules"),
            "EFA_DEVICE_DIR": str(devices),
            "IMDS_reservation_id": reservation,
            "IMDS_local_ipv4": instance["PrivateIpAddress"],
            "EC2_SERVICE_ACCESS_KEY_ID": service.access_key,
            "EC2_SERVICE_SECRET_ACCESS_KEY": service.secret_key,
            "REHEARSAL_TRAINED_MODEL": str(self.trained_model),
        }
        env.pop("PYTHONPATH")  # the host's python3 knows only what the user data unpacked
        with (host / "user-data.out").open("wb") as output:
            return subprocess.Popen(["bash", str(host / "user-data.sh")], cwd=host, env=env, stdout=output,
                                    stderr=subprocess.STDOUT)  # fmt: skip

    def remote(self) -> str:
        from proving_ground.rehearsal.remote_job_player import played_remote_jobs

        assert self.deployment is not None
        config = self.work / "remote" / "config.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        fetch = self.stack_output("Training", f"FetchRemoteFunctionConfigCommand{self.remote_caller_suffix()}")
        fetched = self.shell(REMOTE_LAUNCHER, ["bash", "-c", f"{fetch} > {config}"], cwd=self.work)
        if fetched.returncode != 0 or not config.read_text().strip():
            raise StepFailed(f"`{fetch}` failed: {fetched.stderr.strip()}")
        datasets = self.stack_output("Foundation", "DatasetsBucketName")
        s3 = self.client("s3", OPERATOR)
        for split in ("train", "validation"):
            s3.put_object(Bucket=datasets, Key=f"tweets/{split}.csv", Body=b"text,label\nhi,1\n")
        from training_assets import remote_train

        image = REMOTE_IMAGE.format(region=self.region)
        out, err = io.StringIO(), io.StringIO()
        with (
            played_remote_jobs(self, self.work / "remote") as jobs,
            self.acting_as(REMOTE_LAUNCHER),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            code = remote_train.main(["--config", str(config), "--image-uri", image, "train", "--",
                                      "--dataset", f"s3://{datasets}/tweets/"])  # fmt: skip
        if code != 0 or jobs.exit_codes != [0]:
            raise StepFailed(f"remote_train exited {code}, job exit codes {jobs.exit_codes}: {err.getvalue()[-400:]}")
        return f"job {jobs.names[0]} ran as the job role; its log stream followed; metrics read back"
