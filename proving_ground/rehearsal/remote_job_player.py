"""A SageMaker training job of ``@remote``, played in this process for the rehearsal
(proving_ground/rehearsal/rehearse.py).

moto's CreateTrainingJob marks the job Completed at once and runs nothing. Right after the call returns, the job is
played as SageMaker would run it: the SDK's own ``invoke_function`` entry point with the request's container
arguments and secret key, as the job's role (its access key in the environment), with ``train()`` replaced by a stub
that writes a model (real training is tests/training_assets/test_train_sentiment.py's subject); then the job's log
stream is written by SageMaker itself. The same stand-ins as tests/training_assets/test_remote_sdk_moto.py: the job's
input folder moves under the work folder, and RemoteExecutor's polling intervals and the job waiter's first sleep
(5 s) are set to 0.
The SDK validates its config against its JSON schema each time it reads a value (19 times a job, 66 ms each): here
each distinct config is validated once, with the same outcome.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


class Actor(Protocol):
    """What the player needs from the rehearsal: act as a principal, and a client of a principal."""

    def acting_as(self, principal: str) -> contextlib.AbstractContextManager[None]: ...

    def client(self, service: str, principal: str = ...) -> Any: ...


JOB_ROLE, AWS_SERVICE = "@remote job role", "aws service"


@dataclass
class PlayedJobs:
    names: list[str] = field(default_factory=list)
    exit_codes: list[int] = field(default_factory=list)


def stub_train(config: Any, callbacks: Any = ()) -> dict[str, Any]:
    """Stands in for train_sentiment.train inside the played job: checks the downloaded dataset, writes a model."""
    dataset = Path(config.dataset)
    assert (dataset / "train.csv").is_file() and (dataset / "validation.csv").is_file()
    saved = Path(config.output_dir) / "saved_model"
    saved.mkdir(parents=True)
    (saved / "model.safetensors").write_bytes(b"weights")
    metrics = {"epochs": [{"epoch": 1.0, "eval_macro_f1": 0.5, "eval_accuracy": 0.5}],
               "throughput": {"train_samples_per_second": 100.0}}  # fmt: skip
    (Path(config.output_dir) / "metrics.json").write_text(json.dumps(metrics))
    return metrics


@contextlib.contextmanager
def sdk_config_validated_once() -> Iterator[None]:
    """The SDK validates its whole config against its JSON schema each time it reads a value from it (19 times per
    job, 66 ms each, sagemaker-core 2.27 ``get_sagemaker_config_value``): within this, each distinct config is
    validated once, with the same outcome (an invalid config raises every time it is read)."""
    from sagemaker.core.config.config_manager import SageMakerConfig

    validate = SageMakerConfig.__dict__["validate_sagemaker_config"]
    valid: set[str] = set()

    def validate_once(sagemaker_config: dict[str, Any] | None = None) -> None:
        key = json.dumps(sagemaker_config, sort_keys=True, default=str)
        if key not in valid:
            validate.__func__(sagemaker_config)
            valid.add(key)

    SageMakerConfig.validate_sagemaker_config = staticmethod(validate_once)
    try:
        yield
    finally:
        SageMakerConfig.validate_sagemaker_config = validate


# Long: the SDK's job-starting and job-watching calls patched together and undone together (a context manager)
@contextlib.contextmanager
def played_remote_jobs(actor: Actor, work: Path) -> Iterator[PlayedJobs]:
    import boto3
    import botocore.client
    from sagemaker.core.remote_function import client as remote_client
    from sagemaker.core.remote_function import invoke_function
    from sagemaker.core.remote_function import job as remote_job

    from training_assets import remote_train

    played = PlayedJobs()
    lock = threading.Lock()
    inner = botocore.client.BaseClient._make_api_call

    def play(request: dict[str, Any]) -> None:
        environment = {"REMOTE_FUNCTION_SECRET_KEY": request["Environment"]["REMOTE_FUNCTION_SECRET_KEY"]}
        saved = {name: os.environ.get(name) for name in environment}
        # boto3's default session caches the credentials it was created with (the launcher's): the job starts its own.
        launcher_session, boto3.DEFAULT_SESSION = boto3.DEFAULT_SESSION, None
        with actor.acting_as(JOB_ROLE):
            os.environ.update(environment)
            try:
                invoke_function.main(request["AlgorithmSpecification"]["ContainerArguments"])
            except SystemExit as exit_:
                played.exit_codes.append(int(exit_.code or 0))
            finally:
                for name, value in saved.items():
                    os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
                boto3.DEFAULT_SESSION = launcher_session
        logs = actor.client("logs", AWS_SERVICE)  # SageMaker's own writes
        group, stream = "/aws/sagemaker/TrainingJobs", f"{request['TrainingJobName']}/algo-1-{int(time.time())}"
        with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
            logs.create_log_group(logGroupName=group)
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
        event = {"timestamp": int(time.time() * 1000), "message": "INFO: training finished"}
        logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=[event])

    def with_jobs(client: Any, operation: str, params: dict[str, Any]) -> Any:
        response = inner(client, operation, params)
        if (client.meta.service_model.service_name, operation) == ("sagemaker", "CreateTrainingJob"):
            played.names.append(params["TrainingJobName"])
            with lock:
                play(params)
        return response

    saved_attributes = (remote_train.JOB_INPUT_DIR, remote_train.train, dict(remote_client._API_CALL_LIMIT))
    wait_until = remote_job._wait_until
    saved_environment = {name: os.environ.get(name) for name in ("SM_MODEL_DIR",)}
    saved_cwd = Path.cwd()
    botocore.client.BaseClient._make_api_call = with_jobs
    remote_train.JOB_INPUT_DIR = work / "job" / "input"
    remote_train.train = stub_train
    remote_client._API_CALL_LIMIT.update(dict.fromkeys(remote_client._API_CALL_LIMIT, 0))
    # The SDK's job.wait() sleeps 5 s before its first DescribeTrainingJob; the played job is complete at once.
    remote_job._wait_until = functools.partial(wait_until, poll=0)
    os.environ["SM_MODEL_DIR"] = str(work / "job" / "model")
    os.chdir(remote_train.ROOT)  # the job gets training_assets/ and the dependencies file from here
    boto3.DEFAULT_SESSION = None
    with sdk_config_validated_once():
        try:
            yield played
        finally:
            botocore.client.BaseClient._make_api_call = inner
            remote_train.JOB_INPUT_DIR, remote_train.train = saved_attributes[0], saved_attributes[1]
            remote_client._API_CALL_LIMIT.update(saved_attributes[2])
            remote_job._wait_until = wait_until
            for name, value in saved_environment.items():
                os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
            os.chdir(saved_cwd)
            boto3.DEFAULT_SESSION = None
