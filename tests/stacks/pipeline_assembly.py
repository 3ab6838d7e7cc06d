"""The promotion pipeline synthesized from test settings (three environment accounts and a tooling account), once per
test process: the pipeline's tests and the attackers standing in its builds (tests/stacks/security/
test_delivery_attackers.py, in the same SAME_WORKER group of tests/conftest.py) read the same assembly."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import aws_cdk as cdk

from stacks.compliance import add_compliance_gates
from stacks.pipeline import PromotionPipelineStack
from stacks.settings import load_environments, load_pipeline
from tests.conftest import WITHOUT_BUILTIN_VALIDATION, cdk_context
from tests.stacks.components.promotion_targets import PIPELINE

ACCOUNTS = {"dev": "111111111111", "staging": "222222222222", "prod": "333333333333"}
MODEL_KEY = "endpoints/sentiment/model-v3.tar.gz"


@functools.cache
def pipeline_assembly() -> Path:
    """The cloud assembly's directory (removed with the process's temp files by the OS, as pytest's own are)."""
    outdir = Path(tempfile.mkdtemp(prefix="pipeline-")) / "cdk.out"
    context = cdk_context()
    context.pop("pipeline", None)  # the pipeline's settings are PIPELINE's
    environments = [
        settings.model_copy(
            update={
                "account": ACCOUNTS[settings.name],
                # Every stage serves a named model version, so every stage has a Graviton endpoint.
                "graviton_endpoint": settings.graviton_endpoint.model_copy(update={"model_data_key": MODEL_KEY}),
            }
        )
        for settings in load_environments(context["environments"], None)
    ]
    app = cdk.App(context=context, outdir=str(outdir), **WITHOUT_BUILTIN_VALIDATION)
    PromotionPipelineStack(app, "PromotionPipeline", settings=load_pipeline(PIPELINE), environments=environments)
    add_compliance_gates(app)  # the synth below fails on any unacknowledged cdk-nag finding
    app.synth()
    return outdir
