"""What a newcomer sees when cdk.json is wrong: `cdk synth` (app.py run as a program) prints one sentence and exits 1;
and every environment is validated whatever ``-c env`` selects."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app import build_app
from stacks.settings import SettingsError
from tests.conftest import ROOT, cdk_context


def _with_typo_in_prod() -> dict:
    context = copy.deepcopy(cdk_context())
    context["environments"]["prod"]["training"]["instance_type"] = "p4d.24xlargee"
    return context


def _run_app(context: dict, outdir: Path) -> subprocess.CompletedProcess:
    """app.py as the CDK CLI runs it: the context arrives in CDK_CONTEXT_JSON, the output directory in CDK_OUTDIR."""
    environment = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(context), "CDK_OUTDIR": str(outdir)}
    return subprocess.run(
        [sys.executable, "app.py"], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300
    )


def test_settings_error_is_one_sentence_on_stderr_and_exit_status_1(tmp_path: Path) -> None:
    result = _run_app({**_with_typo_in_prod(), "env": "dev"}, tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "cdk.json: environments.prod.training.instance_type: must be an EC2 instance type with an NVIDIA GPU, of the "
        "families g4dn, g5, g6, g6e, g7, g7e, p2, p3, p3dn, p4d, p4de, p5, p5e, p5en, p6-b200, p6-b300."
    ]
    assert not list(tmp_path.glob("*.template.json")), "nothing is synthesized"


def test_build_app_still_raises_for_tests() -> None:
    with pytest.raises(SettingsError, match=r"^environments\.prod\.training\.instance_type: "):
        build_app(context={**_with_typo_in_prod(), "env": "dev"})


@pytest.mark.parametrize("selection", ["dev", "staging", "dev,staging"])
def test_a_typo_in_an_unselected_environment_fails_synth(selection: str) -> None:
    with pytest.raises(SettingsError, match=r"^environments\.prod\."):
        build_app(context={**_with_typo_in_prod(), "env": selection})


def test_synthesis_imports_nothing_outside_requirements_txt() -> None:
    """`make synth` installs only requirements.txt: app.py must not import the test stack (torch, the SDKs, ...)."""
    heavy = ["torch", "transformers", "datasets", "sagemaker", "boto3", "botocore", "moto", "numpy", "sklearn"]
    probe = f"import sys, app; print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
