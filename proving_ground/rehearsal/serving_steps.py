"""The rehearsal's serving steps: package and upload, check-model, publish to the multi-model endpoint, serve
locally, deploy the endpoint and smoke-test it; SageMaker's part played over the local Ray Serve server.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import io
import json
import tarfile
import threading
from typing import Any

from proving_ground.rehearsal.journey import (
    ACCOUNT,
    ENDPOINT_HANDLERS,
    ENDPOINT_OPERATOR,
    ENDPOINT_ROLE,
    KEYS,
    MME_CLIENT,
    MME_MODEL,
    MODEL_CHECK,
    OPERATOR,
    SERVING_DIGEST,
    SERVING_IMAGE,
    TEXT,
    RehearsalBase,
    StepFailed,
    make_principal,
    sha256_of,
)
from stacks.image_names import image_parameter_name


class ServingSteps(RehearsalBase):
    def package_and_upload(self) -> str:
        from inference_assets.tools import package_model

        downloaded = self.work / "operator" / "run-model.tar.gz"
        downloaded.parent.mkdir(parents=True, exist_ok=True)
        fetched = self.shell(OPERATOR, ["aws", "s3", "cp", "--only-show-errors", self.facts["run_model"],
                                        str(downloaded)])  # fmt: skip
        if fetched.returncode != 0:
            raise StepFailed(f"aws s3 cp {self.facts['run_model']}: {fetched.stderr.strip()}")
        archive = self.work / "operator" / "model.tar.gz"
        key = self.stack_output_of_template("GravitonEndpoint", "ModelDataKey")
        artifacts = self.stack_output("Foundation", "ArtifactsBucketName")
        key_arn = self.stack_output("Foundation", "PlatformKeyArn")
        with self.acting_as(OPERATOR), contextlib.redirect_stdout(io.StringIO()):
            code = package_model.main(["--model-dir", str(self.trained_model), "--output", str(archive),
                                       "--upload", f"s3://{artifacts}/{key}", "--kms-key-id", key_arn])  # fmt: skip
        if code != 0:
            raise StepFailed(f"pytorch-platform package exited {code}")
        if sha256_of(archive) != sha256_of(downloaded):
            raise StepFailed("the EC2 run's model.tar.gz differs from what `pytorch-platform package` builds")
        self.facts["archive"] = archive
        return f"run archive == `pytorch-platform package` output; uploaded s3://{artifacts}/{key}"

    def check_model(self) -> str:
        from inference_assets.tools import model_check

        cdk_json = self.work / "cdk.json"
        key = self.stack_output_of_template("GravitonEndpoint", "ModelDataKey")
        cdk_json.write_text(json.dumps({"context": {"environments": {self.environment: {
            "region": self.region, "graviton_endpoint": {"model_data_key": key}}}}}))  # fmt: skip
        out, err = io.StringIO(), io.StringIO()
        with self.acting_as(OPERATOR), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = model_check.main(["--env", self.environment, "--cdk-json", str(cdk_json)])
        if code != 0:
            raise StepFailed(f"check-model exited {code}: {err.getvalue().strip()}")
        return out.getvalue().strip()

    def publish_multi_model(self) -> str:
        if "MultiModelEndpoint" not in self.stacks:
            return "skipped: the environment has no multi-model endpoint"
        from inference_assets.tools import publish_models

        archive = self.work / "operator" / "mme.tar.gz"
        artifacts = self.stack_output("Foundation", "ArtifactsBucketName")
        key_arn = self.stack_output("Foundation", "PlatformKeyArn")
        prefix = self.stack_output("MultiModelEndpoint", "ModelsPrefix")
        endpoint = self.stack_output("MultiModelEndpoint", "EndpointName")
        self.local_model_server()  # started before the first invocation reaches it (Ray Serve takes a while)
        with self.acting_as(OPERATOR), contextlib.redirect_stdout(io.StringIO()):
            publish_models.main(["package", "--model-dir", str(self.trained_model), "--output", str(archive)])
            publish_models.main(["publish", "--archive", str(archive), "--name", MME_MODEL, "--bucket", artifacts,
                                 "--prefix", prefix, "--kms-key", key_arn, "--region", self.region])  # fmt: skip
        self._serve_endpoint(endpoint, multi_model_prefix=f"s3://{artifacts}/{prefix}")
        out = self.work / "operator" / "mme-answer.json"
        # docs/multi-model.md's command, less --cli-binary-format (an AWS CLI v2 option; this CLI is v1).
        invoked = self.shell(MME_CLIENT, ["aws", "sagemaker-runtime", "invoke-endpoint", "--region", self.region,
                                          "--endpoint-name", endpoint, "--target-model", MME_MODEL,
                                          "--content-type", "application/json",
                                          "--body", json.dumps({"inputs": [TEXT]}), str(out)])  # fmt: skip
        if invoked.returncode != 0:
            raise StepFailed(f"invoke-endpoint --target-model {MME_MODEL}: {invoked.stderr.strip()}")
        answer = json.loads(out.read_text())
        return f"published {prefix}{MME_MODEL}; the client's invocation by name answered {answer[0]['label']}"

    def _serve_endpoint(self, endpoint: str, *, model_data_url: str = "", multi_model_prefix: str = "") -> None:
        """What SageMaker does for an endpoint: read the model with the execution role; answer invocations."""
        s3 = self.client("s3", ENDPOINT_ROLE)

        def load(url: str) -> bytes:
            bucket, _, key = url.removeprefix("s3://").partition("/")
            body: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            return body

        if model_data_url:
            loaded = load(model_data_url)
            if hashlib.sha256(loaded).hexdigest() != sha256_of(self.facts["archive"]):
                raise StepFailed(f"{model_data_url} is not the archive that was packaged")
        handlers = ENDPOINT_HANDLERS

        def answer(body: str, target_model: str | None) -> tuple[str, str]:
            if multi_model_prefix:
                if not target_model:
                    raise StepFailed("a multi-model endpoint needs a TargetModel")
                with tarfile.open(fileobj=io.BytesIO(load(multi_model_prefix + target_model))) as archive:
                    names = set(archive.getnames())
                if not {"model.py", "serving.properties"} <= names:
                    raise StepFailed(f"{target_model} is no archive for the endpoint's model server: {sorted(names)}")
            status, _, reply = self.local_model_server().invoke(body.encode())
            if status != 200:
                raise StepFailed(f"the model server answered {status}: {reply[:200]!r}")
            return reply.decode(), "application/json"

        handlers[endpoint.lower()] = answer

    def _stop_local_server(self, *, wait: bool) -> None:
        """Stop the local Ray Serve server in the background; ``wait``: and wait for every stop begun."""
        server, self.local_server = self.local_server, None
        if server is not None:
            self._stopping.append(threading.Thread(target=server.stop, name="stop local server"))
            self._stopping[-1].start()
        if wait:
            for thread in self._stopping:
                thread.join()

    def local_model_server(self) -> Any:
        if self.local_server is None:
            from inference_assets.local.local_server import LocalRayServer

            archive = self.facts.get("archive") or self.work / "operator" / "model.tar.gz"
            self.local_server = LocalRayServer(archive, workers=1).start()
        return self.local_server

    def serve_locally(self) -> str:
        server = self.local_model_server()
        status, _, reply = server.invoke(json.dumps({"inputs": TEXT}).encode())
        if status != 200:
            raise StepFailed(f"the local server answered {status}: {reply[:200]!r}")
        prediction = json.loads(reply)
        prediction = prediction[0] if isinstance(prediction, list) else prediction
        return f"Ray Serve on {server.url}: {prediction['label']}"

    def deploy_endpoint_and_smoke_test(self) -> str:
        from inference_assets.tools import endpoint_client

        assert self.deployment is not None
        # The image digest the operator published before preflight (README, First deploy, step 2), as the
        # pipeline would (docs/images.md, "Deploying by hand").
        self.client("ssm", OPERATOR).put_parameter(
            Name=image_parameter_name(self.settings().tags.project, SERVING_IMAGE),
            Type="String",
            Value=getattr(self, "serving_image_uri", SERVING_DIGEST),
            Overwrite=True,
        )
        checked: list[str] = []
        self.deployment.custom_creators["Custom::ModelArchiveCheck"] = lambda deployment, stack_id, logical, props: (
            self._model_archive_check(stack_id, logical, checked)
        )
        deployed = self.deployment.deploy("GravitonEndpoint")
        self.refresh_role_policies()
        endpoint = deployed.outputs["EndpointName"]
        model = self.deployment.resolve(
            "GravitonEndpoint",
            next(r for r in self.stacks["GravitonEndpoint"].template["Resources"].values()
                 if r["Type"] == "AWS::SageMaker::Model")["Properties"]["PrimaryContainer"]["ModelDataUrl"],
        )  # fmt: skip
        self._serve_endpoint(endpoint, model_data_url=model)
        out, err = io.StringIO(), io.StringIO()
        with self.acting_as(OPERATOR), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = endpoint_client.main(["smoke-test", "--endpoint-name", endpoint, "--region", self.region,
                                         "--poll", "0"])  # fmt: skip
        if code != 0:
            raise StepFailed(f"smoke test exited {code}: {err.getvalue().strip()}")
        # That was the last invocation (the later steps invoke no endpoint): Ray stops now, not idle till the end,
        # and while the next steps run (its shutdown takes seconds, mostly waiting).
        self._stop_local_server(wait=False)
        return f"{' '.join(checked)} {out.getvalue().strip()}"

    def change_endpoint_instance(self) -> str:
        """docs/operations.md, "Change an endpoint's instance type", played on the rehearsed Graviton endpoint."""
        from ops_review import change_instance

        assert self.gate is not None and self.deployment is not None
        stack = self.stacks["GravitonEndpoint"]
        changed = copy.deepcopy(stack.template)
        (config,) = [r for r in changed["Resources"].values() if r["Type"] == "AWS::SageMaker::EndpointConfig"]
        old = config["Properties"]["ProductionVariants"][0]["InstanceType"]
        new = "ml.c7g.4xlarge" if old == "ml.c7g.2xlarge" else "ml.c7g.2xlarge"
        for variant in config["Properties"]["ProductionVariants"]:
            variant["InstanceType"] = new
        planned = change_instance.planned_from_template(dataclasses.replace(stack, template=changed))
        policy = change_instance.required_policy(planned.endpoint_name, self.region, ACCOUNT)
        arn = f"arn:aws:iam::{ACCOUNT}:role/endpoint-operator"
        self.gate.principals.append(make_principal(ENDPOINT_OPERATOR, KEYS[ENDPOINT_OPERATOR], [policy], arn, "ops"))
        self.gate.save(self.gate_file)
        said: list[str] = []
        deployment = self.deployment

        def deploy(_: change_instance.Planned) -> int:
            deployment.update("GravitonEndpoint", changed)  # `cdk deploy`: CloudFormation, as the deployer
            return 0

        code = change_instance.change_instance_type(
            planned, lambda service: self.client(service, ENDPOINT_OPERATOR), deploy,
            state_file=self.work / "graviton-scaling.json", timeout_s=60, poll_s=0, log=said.append,
            sleep=lambda _: None,
        )  # fmt: skip
        running = change_instance.running_instance_types(self.client("sagemaker", OPERATOR), planned.endpoint_name)
        targets = self.client("application-autoscaling", OPERATOR).describe_scalable_targets(
            ServiceNamespace="sagemaker", ResourceIds=list(planned.scaling)
        )["ScalableTargets"]
        if code != 0 or running[1] != planned.instance_types or len(targets) != len(planned.scaling):
            raise StepFailed(f"change-endpoint-instance exited {code}: {running}, {len(targets)} targets; {said}")
        return f"{old} -> {new}: {said[-1]}"

    def _model_archive_check(self, stack_id: str, logical: str, said: list[str]) -> str:
        """CloudFormation creates the stack's model archive check (Custom::ModelArchiveCheck) before its model: the
        handler's check runs here as the check's role, every call checked against that role's policy."""
        import boto3

        from stacks.components.model_archive_check import handler

        assert self.gate is not None and self.deployment is not None
        properties = self.stacks[stack_id].template["Resources"][logical]["Properties"]
        check = self.deployment.resolve(stack_id, {k: properties[k] for k in ("Bucket", "Key", "Setting")})
        role_name = self.deployment.role_name(stack_id, "ModelArchiveCheckRole")
        self.gate.principals.append(
            make_principal(
                MODEL_CHECK,
                KEYS[MODEL_CHECK],
                self.deployment.role_policies(role_name),
                f"arn:aws:iam::{ACCOUNT}:role/{role_name}",
                "model-archive-check",
                self.deployment.role_tags(role_name),
            )
        )
        self.gate.save(self.gate_file)
        with self.acting_as(MODEL_CHECK):
            try:
                said.append(
                    handler.check_archive(
                        boto3.client("s3", region_name=self.region), check["Bucket"], check["Key"], check["Setting"]
                    )
                )
            except handler.ArchiveMissing as error:
                raise StepFailed(str(error)) from None
        return self.deployment.set_ref(stack_id, logical, f"model-archive-check-{check['Key']}")
