"""Images are facts with patch windows: synth refuses an image past its publisher's end of patching unless the
environment accepts the risk with a reason, warns 60 days ahead, and the ops review lists every image with its days
left. Every date is injected: nothing here depends on the clock."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import pytest

from app import build_app
from ops_review.__main__ import main as review_main
from ops_review.review import review_assembly
from platform_facts.images import WARN_DAYS, PatchStatus, image_facts, training_images
from stacks.image_patching import SERVING_IMAGE_FACT, check_images, warning
from stacks.settings import SettingsError, TrainingSettings, parse_environment
from tests.conftest import ROOT, cdk_context

SERVING_IMAGE_BASE = "public.ecr.aws/amazonlinux/amazonlinux:2023"  # the serving image's base
GRAVITON_TORCHSERVE = "pytorch-inference-arm64:2.6.0-cpu-py312-ubuntu22.04-sagemaker"  # ended; nobody chooses it
# The training DLCs every environment runs (none overrides the defaults): the image table's entries, with their ends.
_EC2, _SAGEMAKER = TrainingSettings().image, TrainingSettings().remote_image
TRAINING, REMOTE_TRAINING = _EC2.image, _SAGEMAKER.image
assert _EC2.end_of_patching and _SAGEMAKER.end_of_patching
TRAINING_END = _EC2.end_of_patching
AFTER_TRAINING = max(TRAINING_END, _SAGEMAKER.end_of_patching) + timedelta(days=1)  # both training DLCs have ended
CHECKED_ON = date(2026, 12, 5)
LAST_CHECKED = date(2026, 12, 6)  # the newest "checked" of the table (the serving image's row)
REASON = "The p4d runs are pinned to this image until the AL2023 PyTorch image is validated (ticket ML-123)."


def _raw(name: str) -> dict:
    return copy.deepcopy(cdk_context()["environments"][name])


def test_every_entry_has_a_source_a_checked_date_and_a_replacement() -> None:
    for image, fact in image_facts().items():
        assert ":" in image and fact.architecture in ("x86_64", "arm64"), image
        assert fact.source.startswith("https://"), image
        assert fact.replacement and fact.checked <= LAST_CHECKED, image


@pytest.mark.parametrize(
    ("image", "today", "status", "days"),
    [
        (TRAINING, TRAINING_END - timedelta(days=WARN_DAYS + 1), PatchStatus.PATCHED, WARN_DAYS + 1),
        (TRAINING, TRAINING_END - timedelta(days=WARN_DAYS), PatchStatus.ENDING, 60),
        (TRAINING, TRAINING_END, PatchStatus.ENDING, 0),
        (TRAINING, TRAINING_END + timedelta(days=1), PatchStatus.ENDED, -1),
        (GRAVITON_TORCHSERVE, CHECKED_ON, PatchStatus.ENDED, -158),
        (SERVING_IMAGE_BASE, CHECKED_ON, PatchStatus.PATCHED, 938),
        ("djl-inference:0.36.0-cpu-full", CHECKED_ON, PatchStatus.UNDECLARED, None),
    ],
)
def test_patch_status_by_date(image: str, today: date, status: PatchStatus, days: int | None) -> None:
    fact = image_facts()[image]
    assert fact.status(today) is status
    assert fact.days_left(today) == days


def test_the_graviton_endpoint_is_checked_against_its_images_parts() -> None:
    """The endpoint runs the platform's image, rebuilt every week on Amazon Linux 2023: its patch window is the
    earliest of its parts' (AL2023, its Python 3.12, Ray), and no environment accepts an ended image any more."""
    for name in ("dev", "staging", "prod"):
        raw = _raw(name)
        assert "accept_unpatched_images" not in raw
        (graviton,) = [
            c for c in check_images(parse_environment(name, raw), CHECKED_ON) if c.use.stack == "GravitonEndpoint"
        ]
        assert (graviton.use.image, graviton.use.setting) == (SERVING_IMAGE_FACT, "images.graviton-serving")
        assert graviton.accepted_risk is None and graviton.fact.end_of_patching == date(2028, 10, 1)
        parts = {part.part.split(" (")[0]: part.end_of_patching for part in graviton.fact.parts}
        assert parts == {"Amazon Linux 2023": date(2029, 6, 30), "Python 3.12": date(2028, 10, 1), "Ray 2.57.0": None}


def test_synth_warns_then_refuses_the_serving_image_as_its_python_ends() -> None:
    raw = _raw("prod")
    raw["accept_unpatched_images"] = {TRAINING: REASON, REMOTE_TRAINING: REASON}  # they end before it
    settings = parse_environment("prod", raw)
    end = date(2028, 10, 1)
    (graviton,) = [c for c in check_images(settings, end - timedelta(days=30)) if c.use.stack == "GravitonEndpoint"]
    message = warning(graviton, end - timedelta(days=30))
    assert message is not None and "ends patching on 2028-10-01 (30 days left)" in message
    with pytest.raises(SettingsError, match=rf"graviton-serving: {SERVING_IMAGE_FACT} ended patching on 2028-10-01"):
        check_images(settings, end + timedelta(days=1))


def test_an_ended_image_without_acceptance_stops_synth_with_one_sentence() -> None:
    settings = parse_environment("prod", _raw("prod"))
    with pytest.raises(SettingsError) as error:
        check_images(settings, AFTER_TRAINING)
    message = str(error.value)
    assert message.startswith(f"environments.prod.training.image_tag: {TRAINING} ended patching")
    assert str(TRAINING_END) in message and "environments.prod.accept_unpatched_images" in message
    assert message.count(". ") == 0 and message.endswith(".")


def test_the_same_image_passes_before_its_end() -> None:
    settings = parse_environment("prod", _raw("prod"))
    assert {c.use.image for c in check_images(settings, TRAINING_END)} >= {SERVING_IMAGE_FACT, TRAINING}


def test_an_accepted_risk_passes_and_carries_its_reason() -> None:
    raw = _raw("prod")
    raw["accept_unpatched_images"] = {TRAINING: REASON, REMOTE_TRAINING: REASON}
    (training, remote) = [
        c for c in check_images(parse_environment("prod", raw), AFTER_TRAINING) if c.use.stack == "Training"
    ]
    assert training.accepted_risk == remote.accepted_risk == REASON
    assert training.metadata()["accepted_risk"] == REASON


def test_the_torchserve_multi_model_option_is_no_setting_any_more() -> None:
    """Neither the model server (DJL is the only one) nor a TorchServe image is a setting: each key stops synth."""
    raw = _raw("staging")
    raw["multi_model_endpoint"]["model_server"] = "torchserve"
    with pytest.raises(SettingsError, match=r"^environments\.staging\.multi_model_endpoint\.model_server: "):
        parse_environment("staging", raw)
    raw = _raw("staging")
    raw["multi_model_endpoint"]["torchserve_image"] = GRAVITON_TORCHSERVE
    with pytest.raises(SettingsError, match=r"^environments\.staging\.multi_model_endpoint\.torchserve_image: "):
        parse_environment("staging", raw)


def test_an_acceptance_for_an_image_nobody_chooses_is_refused() -> None:
    raw = _raw("dev")
    raw["accept_unpatched_images"] = {GRAVITON_TORCHSERVE: REASON}
    with pytest.raises(SettingsError, match=r"^environments\.dev\.accept_unpatched_images: accepts the risk of"):
        check_images(parse_environment("dev", raw), CHECKED_ON)


def test_an_image_without_a_fact_is_refused() -> None:
    raw = _raw("dev")
    raw["training"]["image_tag"] = "2.99.0-cu999-amzn2023"
    with pytest.raises(SettingsError, match=r"^environments\.dev\.training\.image_tag: .* platform_facts/images\.json"):
        check_images(parse_environment("dev", raw), CHECKED_ON)


@pytest.mark.parametrize(("graviton", "multi_model"), [(False, True), (True, False), (False, False)])
def test_each_enabled_endpoint_has_its_image_checked_whatever_the_other_does(graviton: bool, multi_model: bool) -> None:
    """An endpoint's image is checked when that endpoint is enabled, not when the other one is: a DJL image nobody
    has a fact for stops synth with the Graviton endpoint off, and is not looked at with the multi-model one off."""
    raw = _raw("dev")
    raw.setdefault("graviton_endpoint", {})["enabled"] = graviton
    raw.setdefault("multi_model_endpoint", {})["enabled"] = multi_model
    raw["multi_model_endpoint"]["djl_image"] = "djl-inference:0.99.0-cpu-full"
    settings = parse_environment("dev", raw)
    if not multi_model:
        checked = {c.use.stack for c in check_images(settings, CHECKED_ON)}
        assert checked == {"Training"} | ({"GravitonEndpoint"} if graviton else set())
        return
    with pytest.raises(SettingsError, match=r"^environments\.dev\.multi_model_endpoint\.djl_image: djl-inference"):
        check_images(settings, CHECKED_ON)


@pytest.mark.parametrize(("key", "platform"), [("image_tag", "sagemaker"), ("remote_image_tag", "ec2")])
def test_a_training_image_of_the_other_flavour_is_refused(key: str, platform: str) -> None:
    """The EC2 runs need the EC2 flavour (docker run), the @remote jobs the SageMaker one (its training toolkit)."""
    raw = _raw("dev")
    raw["training"][key] = next(fact.tag for fact in training_images(platform))  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match=rf"^environments\.dev\.training\.{key}: .* is no \w+ training image of"):
        parse_environment("dev", raw)


def test_the_ubuntu_training_images_are_history_that_nothing_chooses() -> None:
    """Every training DLC the environments or the pipeline choose is the newest of its flavour; each older one names
    its replacement, a row of the table of the same flavour patched longer (AWS: the Ubuntu 2.8-2.10 images cannot
    be fully patched)."""
    for platform, chosen in (("ec2", _EC2), ("sagemaker", _SAGEMAKER)):
        rows = training_images(platform)  # type: ignore[arg-type]
        newest = max(rows, key=lambda fact: fact.end_of_patching or date.min)
        assert chosen == newest, platform
        for name in ("dev", "staging", "prod"):
            settings = parse_environment(name, _raw(name)).training
            assert (settings.image if platform == "ec2" else settings.remote_image) == newest
        for old in (fact for fact in rows if fact != newest):
            replacement = image_facts()[old.replacement.split(" ")[0]]
            assert replacement.training and replacement.training.platform == platform, old.image
            assert replacement.end_of_patching and old.end_of_patching
            assert replacement.end_of_patching > old.end_of_patching, old.image


@pytest.mark.parametrize(
    "reason", ["", "   because   ", " " * 25, "because" + " " * 20], ids=["empty", "short", "blank", "padded"]
)
def test_an_acceptance_needs_a_real_reason(reason: str) -> None:
    raw = _raw("dev")
    raw["accept_unpatched_images"] = {GRAVITON_TORCHSERVE: reason}
    with pytest.raises(SettingsError, match=r"^environments\.dev\.accept_unpatched_images: .*reason of at least 20"):
        parse_environment("dev", raw)


def test_cdk_synth_prints_the_sentence_and_exits_1(tmp_path: Path) -> None:
    context = cdk_context(env="prod", today=AFTER_TRAINING.isoformat())
    result = subprocess.run(
        [sys.executable, "app.py"],
        cwd=ROOT,
        env={**os.environ, "CDK_CONTEXT_JSON": json.dumps(context), "CDK_OUTDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"cdk.json: environments.prod.training.image_tag: {TRAINING} ")
    assert f"ended patching on {TRAINING_END}" in line


# A synth 47 days before the training DLC's end: inside the warning window, well before the other images' ends.
SYNTH_DAY = TRAINING_END - timedelta(days=47)


@pytest.fixture(scope="module")
def prod_assembly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    outdir = tmp_path_factory.mktemp("prod-images")
    build_app(context=cdk_context(env="prod", today=SYNTH_DAY.isoformat()), outdir=str(outdir)).synth()
    return outdir


@pytest.mark.slow
def test_synth_records_the_images_and_warns(prod_assembly: Path) -> None:
    (graviton,) = (prod_assembly / "assembly-prod").glob("prodGravitonEndpoint*.template.json")
    (recorded,) = json.loads(graviton.read_text())["Metadata"]["PytorchPlatformImages"]
    assert recorded["image"] == SERVING_IMAGE_FACT and recorded["end_of_patching"] == "2028-10-01"
    assert recorded.get("accepted_risk") is None  # CDK leaves null values out of the metadata
    warnings = {
        path.name: [
            e["data"] for es in json.loads(path.read_text()).values() for e in es if e["type"] == "aws:cdk:warning"
        ]
        for path in (prod_assembly / "assembly-prod").glob("*.metadata.json")
    }
    training = next(w for name, w in warnings.items() if name.startswith("prodTraining"))
    assert any("training.image_tag" in w and "(47 days left)" in w for w in training)
    endpoint = next(w for name, w in warnings.items() if name.startswith("prodGravitonEndpoint"))
    assert not [w for w in endpoint if "patching" in w]


@pytest.mark.slow
def test_the_review_lists_every_image_with_its_days_left(prod_assembly: Path, tmp_path: Path) -> None:
    reviews = review_assembly(prod_assembly, today=CHECKED_ON)["prod"]
    listed = {i["image"]: i for review in reviews.values() for i in review["images"]}
    serving = listed[SERVING_IMAGE_FACT]
    assert serving["days_left"] == (date(2028, 10, 1) - CHECKED_ON).days and serving["accepted_risk"] is None
    assert GRAVITON_TORCHSERVE not in listed
    assert listed[TRAINING]["days_left"] == (TRAINING_END - CHECKED_ON).days  # counted from the review's day
    assert listed["djl-inference:0.36.0-cpu-full"]["days_left"] is None
    review_day = TRAINING_END - timedelta(days=20)
    assert review_main([str(prod_assembly), "--out", str(tmp_path), "--today", review_day.isoformat()]) == 0
    markdown = (tmp_path / "prod.md").read_text()
    assert "## Images and their patch windows" in markdown
    row = next(line for line in markdown.splitlines() if line.startswith(f"| {TRAINING} "))
    assert "| 20 |" in row  # days left counted from --today, not from the clock or the synth's day
