"""`make rehearse`: the README's journey, in order, against one moto server, every AWS call checked.

    python -m proving_ground.rehearsal.rehearse                    # synthesize dev (model key set), rehearse it
    python -m proving_ground.rehearsal.rehearse --assembly cdk.out --env staging

Steps, as the README ("First deploy"), docs/training.md, docs/multi-model.md and docs/operations.md tell them:

 1. synth             the environment's cloud assembly: the one given, or dev synthesized with
                      ``graviton_endpoint.model_data_key`` set (the README's step 3, so its endpoint can deploy);
 2. preflight         the operator publishes the serving image first (README's step 2: an arm64 image in the tooling
                      account's ECR, whose policy names this account, and its digest in the SSM parameter), then
                      ``pytorch-platform preflight -c env=<env>``: no blocker (quotas answer 1000, see below);
 3. deploy            what `cdk bootstrap` leaves, the code assets published, then Foundation, Training and
                      MultiModelEndpoint through moto's CloudFormation, what it cannot create made by hand with its
                      policies (proving_ground/rehearsal/deployment.py; the report's table per resource type);
 4. EC2 training run  the Training stack's run command (a stack output) as the training launcher; every instance runs
                      the launch template's user data for real with bash (so ec2_run.sh), as the instance role, with
                      the host shims of proving_ground/rehearsal/ec2_host.py; the instances power off;
 5. package, upload   the operator fetches the run's model.tar.gz, checks that ``pytorch-platform package`` builds the
                      same bytes from the trained model, and uploads it to the endpoint's model key;
 6. check-model       ``pytorch-platform check-model --env <env>`` (bucket from the Foundation stack's outputs);
 7. publish (MME)     ``pytorch-platform publish package`` + ``publish publish`` under the endpoint's models prefix,
                      then a client holding the stack's InvokePolicy invokes the model by name (the AWS CLI);
 8. serve locally     the archive on Ray Serve, as the endpoint serves it, one prediction;
 9. smoke test        the operator writes the serving image's digest parameter, GravitonEndpoint deployed (its
                      model archive check run as the check's role);
                      ``pytorch-platform smoke-test`` against it;
    change instance   a larger ``graviton_endpoint.instance_type`` (the template's endpoint config changed as synth
                      would change it) deployed by ``change-endpoint-instance`` as an operator holding only its
                      ``--print-policy``: the scaling deregistered (moto, like SageMaker here, refuses to change an
                      autoscaled variant's type), the stack updated, the scaling registered again;
10. @remote           ``python -m training_assets.remote_train ... train`` with the config the stack writes to SSM;
11. destroy, cleanup  the stacks' resources deleted, then ``pytorch-platform cleanup --env <env>``.

Principals: each acts with its own access key, and proving_ground/rehearsal/aws_calls.py checks every call against the
synthesized
policies of the key's principal (the training launcher, the training instance role, the endpoint execution role, the
multi-model endpoint's client, the @remote launcher and job role). Recorded but not checked: CloudFormation creating
the stacks' resources, the operator (an administrator: the templates give people no policy for uploading models or
running the cleanup), and AWS services acting on their own (EC2 terminating an instance that powered off).

What moto or this machine lacks, the rehearsal plays, and says so here (none of it changes product code):
- CloudFormation: moto's, with the types it cannot create made by hand (deployment.py and hand_made.py say what
  and why); ListStackResources is answered from what the rehearsal recorded (moto's resolves a deleted stack's
  imports again). moto's S3 and KMS apply bucket and key policies without the request's context (the TLS-only and
  perimeter Denies then refuse everything over the rehearsal's http:// endpoint): the call gate evaluates them.
  moto's CloudFormation names an endpoint itself and updates an autoscaled variant's instance type: the rehearsal
  gives it the template's EndpointName and SageMaker's refusal.
- Service Quotas: moto knows only the vpc service's; the rehearsal's account has every quota the templates use raised
  to 1000, the Elastic IPs too (EC2 DescribeAccountAttributes: cdk.json's environments, sharing one account, need six
  of a new account's five), and every interface endpoint service offered in the region's zones (moto's
  DescribeVpcEndpointServices needs every moto extra).
- moto has no placement groups (the launch template is created without one; RunInstances is still checked against
  it), and refuses ``/aws/service/...`` SSM parameters (the image is moto's Amazon-owned Deep Learning AMI) and
  ``ml.c7g`` types.
- SageMaker runs nothing in moto: when an endpoint starts, the rehearsal loads its model as the endpoint's execution
  role, and InvokeEndpoint answers through the local Ray Serve server over the same archive (DJL Serving, the
  multi-model endpoint's server, cannot run here: the played multi-model endpoint reads the archive as the role
  would, checks its layout and answers through the same local server). A training job is played as in
  tests/training_assets/test_remote_sdk_moto.py (the SDK's own invoke_function as the job role, train() stubbed).
- The training container plays torchrun's rank 0 (tests/training_assets/test_container.py trains for real); the model it
  "trains" is the tiny offline RoBERTa.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proving_ground.rehearsal.aws_calls import (
    STEP_ENV,
    Record,
    parse_json_data_once,
    refusals,
)
from proving_ground.rehearsal.ec2_host import patch_moto_reservation_filter
from proving_ground.rehearsal.journey import (
    ACCOUNT,
    ENDPOINT_HANDLERS,
    MODEL_KEY,
    ROOT,
    STEPS,
    TOLERATED_REFUSALS,
    Report,
    StepFailed,
    StepResult,
)
from proving_ground.rehearsal.platform_steps import PlatformSteps
from proving_ground.rehearsal.serving_steps import ServingSteps
from proving_ground.rehearsal.training_steps import TrainingSteps


class Rehearsal(PlatformSteps, TrainingSteps, ServingSteps):
    """The journey: each step in order (``STEPS``), each failure with the call that was refused."""

    # Long: the step loop with the moto server, environment and patches it sets up and restores in its finally
    def run(self) -> Report:
        self.work.mkdir(parents=True, exist_ok=True)
        # The @remote step's imports (the SDK, torch and transformers through the training code) take half a minute:
        # made while the first steps wait on moto and on the nodes' shell scripts.
        threading.Thread(target=_import_late_steps, daemon=True).start()
        _quiet()
        undo_parsing = parse_json_data_once()
        undo = _patch_moto()
        server = _moto_server()
        server.start()
        host, port = server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        _reset_moto(self.endpoint_url)  # the server shares moto's in-process state: an earlier rehearsal's is gone
        # This process's own tools (check-model, publish, smoke-test, @remote, cleanup) reach moto as a real
        # account would be reached: the endpoint, no profile files, no instance metadata.
        environment = {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_CONFIG_FILE": "/nonexistent",
                       "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip
        cleared = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                   "SAGEMAKER_USER_CONFIG_OVERRIDE", "SAGEMAKER_ADMIN_CONFIG_OVERRIDE")  # fmt: skip
        saved_env = {name: os.environ.get(name) for name in (STEP_ENV, "AWS_DEFAULT_REGION", *environment, *cleared)}
        for name in cleared:
            os.environ.pop(name, None)
        os.environ.update(environment)
        try:
            steps: list[Callable[[], str]] = [
                self.synth,
                self.preflight,
                self.deploy,
                self.ec2_run,
                self.package_and_upload,
                self.check_model,
                self.publish_multi_model,
                self.serve_locally,
                self.deploy_endpoint_and_smoke_test,
                self.change_endpoint_instance,
                self.remote,
                self.destroy_and_clean_up,
            ]
            for name, step in zip(STEPS, steps, strict=True):
                os.environ[STEP_ENV] = name
                started = time.monotonic()
                try:
                    detail = step()
                    ok = True
                    if self._refused(name):
                        raise StepFailed("a call was refused, and the step carried on without it")
                except Exception as error:  # the report names the step and what went wrong
                    if os.environ.get("REHEARSAL_TRACEBACK"):
                        import traceback

                        traceback.print_exc()
                    ok, detail = False, self._failure(name, error)
                self.results.append(StepResult(name, time.monotonic() - started, ok, detail))
                if not ok:
                    break
        finally:
            self.uninstall()
            self._stop_local_server(wait=True)
            _reset_moto(self.endpoint_url)
            server.stop()
            undo()
            undo_parsing()
            for name, value in saved_env.items():
                os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
        coverage = self.deployment.coverage.lines() if self.deployment else []
        return Report(self.environment, self.results, self.gate.records() if self.gate else [], coverage)

    def _refused(self, step: str) -> list[Record]:
        if self.gate is None:
            return []
        return [r for r in refusals(self.gate.records(), step) if (r.service, r.operation) not in TOLERATED_REFUSALS]

    def _failure(self, step: str, error: BaseException) -> str:
        reason = str(error).strip().splitlines()
        text = f"{type(error).__name__}: {reason[0] if reason else ''}"
        if isinstance(error, StepFailed):
            text = "\n".join(reason)
        if self.gate is not None:
            refused = self._refused(step)
            if refused:
                first = refused[0]
                what = first.error if first.error and first.error.startswith("unmapped") else "refused"
                actions = ", ".join(f"{a} on {r}" for a, r in first.requests[:3])
                call = f"{first.service}:{first.operation} {first.target}"
                text += f"\n      {what}: {first.principal} {call} [{actions}]"
        return text


# --------------------------------------------------------------------------------------------------- moto patches


def _import_late_steps() -> None:
    import importlib

    for module in ("sagemaker.core.remote_function", "training_assets.remote_train", "ops_review.cleanup"):
        importlib.import_module(module)
    _quiet()


def _quiet() -> None:
    """The SDK's import turns the root logger to INFO: botocore's and the server's chatter stays out of the report."""
    import logging

    for name in ("botocore", "werkzeug", "sagemaker"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _moto_server() -> Any:
    """moto's threaded server on a free port of 127.0.0.1 that stops at once: its serve_forever looks for the
    shutdown every 50 ms, not every 0.5 s (moto's ThreadedMotoServer, otherwise as it is)."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    class Server(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)
            self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever(poll_interval=0.05)

    return Server(ip_address="127.0.0.1", port=0, verbose=False)


def _reset_moto(endpoint_url: str) -> None:
    """Every moto backend back to empty (moto's own reset API)."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{endpoint_url}/moto-api/reset", method="POST"), timeout=60).read()


def _patch_moto() -> Callable[[], None]:
    """Workarounds in the in-process moto server (see the module docstring); returns the undo."""
    from urllib.parse import unquote

    from moto.sagemaker import models as sagemaker_models
    from moto.sagemakerruntime import responses as runtime_responses

    undo_filter = patch_moto_reservation_filter()
    undo_cloudformation = _patch_moto_cloudformation()
    validate = sagemaker_models.FakeEndpointConfig.validate_instance_type
    invoke = runtime_responses.SageMakerRuntimeResponse.invoke_endpoint

    def any_ml_type(self: Any, instance_type: str) -> None:
        if not instance_type.startswith("ml."):
            validate(self, instance_type)

    def played_invoke(self: Any) -> tuple[int, dict[str, str], str]:
        # POST /endpoints/<name>/invocations (SageMaker Runtime API reference, InvokeEndpoint).
        name = unquote(self.path.split("/")[2])
        handler = ENDPOINT_HANDLERS.get(name.lower())
        error = {"x-amzn-errortype": "ValidationError", "Content-Type": "application/json"}
        if handler is None:
            return 400, error, json.dumps({"message": f"Endpoint {name} of account {ACCOUNT} not found."})
        headers = {k.lower(): v for k, v in self.headers.items()}
        body = self.body.decode() if isinstance(self.body, bytes) else self.body
        try:
            answer, content_type = handler(body, headers.get("x-amzn-sagemaker-target-model"))
        except StepFailed as failure:
            model_error = {**error, "x-amzn-errortype": "ModelError"}
            return 424, model_error, json.dumps({"message": str(failure), "OriginalStatusCode": 500})
        return 200, {"Content-Type": content_type, "x-Amzn-Invoked-Production-Variant": "AllTraffic"}, answer

    sagemaker_models.FakeEndpointConfig.validate_instance_type = any_ml_type  # type: ignore[method-assign]
    runtime_responses.SageMakerRuntimeResponse.invoke_endpoint = played_invoke  # type: ignore[method-assign]

    def undo() -> None:
        sagemaker_models.FakeEndpointConfig.validate_instance_type = validate  # type: ignore[method-assign]
        runtime_responses.SageMakerRuntimeResponse.invoke_endpoint = invoke  # type: ignore[method-assign]
        ENDPOINT_HANDLERS.clear()
        undo_cloudformation()
        undo_filter()

    return undo


# Long: five replacements of moto methods, each with the state it shares with the others, and their undo
def _patch_moto_cloudformation() -> Callable[[], None]:
    """Where moto's CloudFormation and S3 differ from AWS in what the rehearsal deploys (the module docstring);
    returns the undo."""
    from moto.iam.access_control import PermissionResult
    from moto.kms import responses as kms_responses
    from moto.s3 import models as s3_models
    from moto.sagemaker import models as sagemaker_models

    endpoint = sagemaker_models.FakeEndpoint
    endpoint_update = endpoint.__dict__["update_from_cloudformation_json"]
    endpoint_create = endpoint.__dict__["create_from_cloudformation_json"]
    running_types: dict[str, dict[str, str]] = {}  # endpoint name -> variant -> instance type

    def types_of(backend: Any, config_name: str) -> dict[str, str]:
        config = backend.describe_endpoint_config(config_name)
        return {v["VariantName"]: v["InstanceType"] for v in config["ProductionVariants"]}

    def refused_while_autoscaled(cls: Any, original_resource: Any, new_resource_name: str,
                                 cloudformation_json: Any, account_id: str, region_name: str) -> Any:  # fmt: skip
        # SageMaker refuses an update that changes the instance type of a variant registered with Application Auto
        # Scaling (developer guide, "Update endpoints that use auto scaling"); moto updates it.
        from moto.applicationautoscaling.models import applicationautoscaling_backends
        from moto.cloudformation.exceptions import ValidationError

        backend = sagemaker_models.sagemaker_backends[account_id][region_name]
        new_types = types_of(backend, cloudformation_json["Properties"]["EndpointConfigName"])
        # The endpoint's running types: moto's CloudFormation has already deleted the config it replaced.
        name = original_resource.endpoint_name
        targets = applicationautoscaling_backends[account_id][region_name].targets
        for variant, instance_type in running_types.get(name, {}).items():
            scaled = any(f"endpoint/{name}/variant/{variant}" in by_id for by_id in targets.values())
            if scaled and new_types.get(variant, instance_type) != instance_type:
                raise ValidationError(message=f"The update would change the instance type of variant {variant}, "
                                      "a target for automatic scaling: deregister it first")  # fmt: skip
        updated = endpoint_update.__func__(cls, original_resource, new_resource_name, cloudformation_json,
                                           account_id, region_name)  # fmt: skip
        running_types[name] = new_types
        return updated

    def recorded_create(cls: Any, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str,
                        **kwargs: Any) -> Any:  # fmt: skip
        created = endpoint_create.__func__(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
        backend = sagemaker_models.sagemaker_backends[account_id][region_name]
        running_types[created.endpoint_name] = types_of(backend, created.endpoint_config_name)
        return created

    def gate_decides(self: Any, action: str, resource: str) -> Any:
        # moto evaluates a bucket policy without the request's context (its TLS-only Deny then refuses every
        # request over the rehearsal's http:// endpoint); the call gate evaluates it with the context AWS sees.
        return PermissionResult.NEUTRAL

    def key_policy_to_the_gate(key: Any, action: str) -> None:
        # moto's KMS, too, applies a key policy's Deny statements without their conditions (the network perimeter's
        # Deny then refuses everyone); the call gate evaluates the key policy with the request's context.
        return None

    replaced = [
        (s3_models.FakeBucket, "get_permission", gate_decides),
        (kms_responses, "validate_policy", key_policy_to_the_gate),
        # moto's CloudFormation names an endpoint itself; CloudFormation takes the template's EndpointName.
        (endpoint, "cloudformation_name_type", staticmethod(lambda: "EndpointName")),
        (endpoint, "update_from_cloudformation_json", classmethod(refused_while_autoscaled)),
        (endpoint, "create_from_cloudformation_json", classmethod(recorded_create)),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in replaced]
    for owner, name, value in replaced:
        setattr(owner, name, value)

    def undo() -> None:
        for owner, name, value in saved:
            setattr(owner, name, value)

    return undo


# ----------------------------------------------------------------------------------------------------- entry point


def synthesize(environment: str, outdir: Path) -> Path:
    """The environment synthesized from cdk.json, with a model key set when it names none (README step 3)."""
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    from app import build_app

    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    context.pop("pipeline", None)
    graviton = context["environments"][environment].setdefault("graviton_endpoint", {})
    graviton.setdefault("model_data_key", MODEL_KEY)
    build_app(context={**context, "env": environment}, outdir=str(outdir)).synth()
    return outdir


def rehearse(assembly: Path, environment: str, work: Path, trained_model: Path | None = None) -> Report:
    if trained_model is None:
        from training_assets.tiny_model import build_tiny_model

        trained_model = build_tiny_model(work / "tiny-model" / "model")
    return Rehearsal(assembly, environment, work, trained_model).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proving_ground.rehearsal.rehearse", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--env", default="dev", help="environment to rehearse (default: dev)")
    parser.add_argument("--assembly", type=Path, help="a synthesized cloud assembly (default: synthesize --env)")
    parser.add_argument("--work", type=Path, help="work folder (default: a temporary one, removed afterwards)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rehearsal-")))
        assembly = args.assembly
        if assembly is None:
            assembly = synthesize(args.env, work / "cdk.out")
            print(f"synthesized {args.env} into {assembly} ({time.monotonic() - started:.0f} s)")
        report = rehearse(assembly, args.env, work)
        print("\n".join(report.lines()))
    print(f"rehearsal {'passed' if report.ok else 'FAILED at ' + str(report.failed_step)} "
          f"in {time.monotonic() - started:.0f} s")  # fmt: skip
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
