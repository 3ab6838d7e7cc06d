"""Fixtures for the training tests: the sample data, the session's training templates, the host side of an EC2
run (the real AWS CLI and a moto server), and a `python` for training processes that starts warm."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from proving_ground.rehearsal.ec2_host import patch_moto_reservation_filter, shared_aws_cli
from tests.training_assets.warm_python import WarmPython
from training_assets.tiny_model import SAMPLE_DATA

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def sample_data() -> Path:
    return SAMPLE_DATA


@pytest.fixture(scope="session")
def tiny_model_without_dropout(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with dropout off: two runs that should learn alike then differ only where the code differs
    (dropout draws its masks per process and per batch shape, so with it on they would differ by design)."""
    folder = tmp_path_factory.mktemp("no-dropout") / "model"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def training_templates(templates: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """{environment: TrainingStack template}, from the session's one synth of every environment (with the
    compliance gates: an unacknowledged cdk-nag finding fails it)."""
    return {environment: stacks["Training"] for environment, stacks in templates.items()}


@pytest.fixture(scope="session")
def aws_cli() -> Path:
    """The AWS CLI v1 that aws-cdk-lib ships (for BucketDeployment), unpacked once per process: the CLI of the
    instance's host (and of the rehearsal's, when one runs in the same worker)."""
    return shared_aws_cli()


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """A moto server of the module's own on a free local port; its URL."""
    from moto.server import ThreadedMotoServer

    undo = patch_moto_reservation_filter()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        undo()


@pytest.fixture(scope="session")
def warm_python() -> Iterator[WarmPython]:
    """``python`` for the training processes the tests start (and torchrun's workers, by ``env()``'s PYTHON_EXEC),
    each forked from one interpreter that imported torch and transformers once (warm_python.py), with the
    repository on the import path as ``python -m`` from its root would have it."""
    python = WarmPython({**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"})
    yield python
    python.close()


@pytest.fixture()
def compile_without_codegen(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile with the aot_eager backend: TorchDynamo still captures the same graphs under the same guards
    (what compiles, when, and what recompiles is decided there), and AOTAutograd still traces forward and backward,
    but no C++ or Triton code is generated, which on a shared 2-core machine takes minutes per shape."""
    real = torch.compile

    def compile_(model: Any = None, **kwargs: Any) -> Any:
        kwargs.pop("mode", None)
        kwargs.pop("options", None)
        kwargs["backend"] = "aot_eager"
        return real(model, **kwargs) if model is not None else real(**kwargs)

    monkeypatch.setattr(torch, "compile", compile_)
