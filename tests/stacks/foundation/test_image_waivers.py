"""An accepted image waives that image only (stacks/image_patching.py): with two ended images in use, accepting one
still stops synth on the other, and every refusal of an acceptance says which entry is wrong. Nothing synthesizes
here: settings and dates only."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from platform_facts.images import METADATA_KEY, WARN_DAYS, image_fact
from stacks.image_patching import check_images, warning
from stacks.settings import SettingsError, TrainingSettings, parse_environment
from tests.conftest import cdk_context

EC2, SAGEMAKER = TrainingSettings().image, TrainingSettings().remote_image
assert EC2.end_of_patching and SAGEMAKER.end_of_patching
EC2_END = EC2.end_of_patching
BOTH_ENDED = max(EC2_END, SAGEMAKER.end_of_patching) + timedelta(days=1)
REASON = "Pinned until the next PyTorch image is validated on p4d (ticket ML-123)."


def _prod(accepted: dict[str, str] | None = None):
    raw = copy.deepcopy(cdk_context()["environments"]["prod"])
    if accepted is not None:
        raw["accept_unpatched_images"] = accepted
    return parse_environment("prod", raw)


@pytest.mark.parametrize(("accepted", "refused", "key"), [(EC2, SAGEMAKER, "remote_image_tag"),
                                                          (SAGEMAKER, EC2, "image_tag")])  # fmt: skip
def test_accepting_one_ended_image_does_not_waive_another(accepted, refused, key) -> None:
    with pytest.raises(SettingsError) as error:
        check_images(_prod({accepted.image: REASON}), BOTH_ENDED)
    assert str(error.value).startswith(f"environments.prod.training.{key}: {refused.image} ended patching")


def test_accepting_both_passes_and_each_carries_its_own_reason() -> None:
    other = "A second, different reason: the SageMaker flavour is pinned too (ML-124)."
    checked = check_images(_prod({EC2.image: REASON, SAGEMAKER.image: other}), BOTH_ENDED)
    reasons = {c.use.image: c.accepted_risk for c in checked}
    assert reasons[EC2.image] == REASON and reasons[SAGEMAKER.image] == other
    assert all(c.accepted_risk is None for c in checked if c.use.image not in (EC2.image, SAGEMAKER.image))


def test_an_acceptance_for_an_image_in_use_but_not_ended_is_kept_and_reported() -> None:
    # Accepted before its end: synth passes and says nothing until the window's warning applies.
    before_the_window = EC2_END - timedelta(days=WARN_DAYS + 1)
    checked = check_images(_prod({EC2.image: REASON}), before_the_window)
    (training,) = [c for c in checked if c.use.setting == "training.image_tag"]
    assert training.accepted_risk == REASON
    assert warning(training, before_the_window) is None


@pytest.mark.parametrize(("days_before_end", "says"), [(WARN_DAYS + 1, None), (WARN_DAYS, "60 days left"),
                                                       (0, "0 days left"), (-1, "running it anyway")])  # fmt: skip
def test_the_warning_starts_exactly_warn_days_before_the_end(days_before_end: int, says: str | None) -> None:
    today = EC2_END - timedelta(days=days_before_end)
    accepted = {EC2.image: REASON, SAGEMAKER.image: REASON} if days_before_end < 0 else None
    (training,) = [c for c in check_images(_prod(accepted), today) if c.use.setting == "training.image_tag"]
    message = warning(training, today)
    assert (message is None) if says is None else (says in (message or ""))


def test_an_image_whose_publisher_declares_no_end_is_never_refused_or_warned() -> None:
    raw = copy.deepcopy(cdk_context()["environments"]["staging"])
    settings = parse_environment("staging", raw)
    far = EC2_END - timedelta(days=WARN_DAYS + 1)
    (djl,) = [c for c in check_images(settings, far) if c.use.stack == "MultiModelEndpoint"]
    assert image_fact(djl.use.image).end_of_patching is None and warning(djl, far) is None


@pytest.mark.parametrize("key", ["pytorch-training", "Pytorch:1", "a b:c"])
def test_an_acceptance_key_that_is_no_image_is_refused(key: str) -> None:
    with pytest.raises(SettingsError, match=r"^environments\.prod\.accept_unpatched_images: .*repository:tag"):
        _prod({key: REASON})


@pytest.mark.parametrize(("reason", "accepted"), [("x" * 19, False), ("x" * 20, True), ("  " + "x" * 19 + "  ", False)])
def test_a_reason_needs_twenty_characters_besides_spaces(reason: str, accepted: bool) -> None:
    if accepted:
        assert _prod({EC2.image: reason}).accept_unpatched_images == {EC2.image: reason}
    else:
        with pytest.raises(SettingsError, match="reason of at least 20 characters"):
            _prod({EC2.image: reason})


def test_the_review_reads_back_what_synth_records_for_each_image() -> None:
    """The joint of synth and review: record_images writes each checked image into the stack's metadata and warns
    about the ones ending or ended; the ops review reads the same fields back, with the days left on its date."""
    import aws_cdk as cdk

    from ops_review.review import images as reviewed_images
    from stacks.image_patching import record_images
    from tests.stacks.components.bare_stack import bare_stack, template_of

    today = EC2_END - timedelta(days=10)  # the EC2 DLC is in its warning window, the SageMaker one too
    checked = [
        c for c in check_images(_prod({EC2.image: REASON}), today) if c.use.stack in ("Training", "MultiModelEndpoint")
    ]
    stack = bare_stack()
    record_images(stack, checked, today)
    warnings = [
        m.entry.data
        for m in cdk.assertions.Annotations.from_stack(stack).find_warning("*", cdk.assertions.Match.any_value())
    ]
    template = template_of(stack)
    read = {entry["setting"]: entry for entry in reviewed_images(template, today)}
    # The publisher is for the operator reading the template (the review does not show it).
    recorded = {image["setting"]: image for image in template["Metadata"][METADATA_KEY]}
    assert recorded["training.image_tag"]["publisher"] == EC2.publisher
    assert set(read) == {c.use.setting for c in checked}
    ec2 = read["training.image_tag"]
    assert (ec2["image"], ec2["architecture"], ec2["accepted_risk"]) == (EC2.image, EC2.architecture, REASON)
    assert (ec2["end_of_patching"], ec2["days_left"]) == (EC2_END.isoformat(), 10)
    assert (ec2["source"], ec2["checked"], ec2["replacement"]) == (EC2.source, EC2.checked.isoformat(), EC2.replacement)
    djl = read["multi_model_endpoint.djl_image"]  # prod runs the multi-model endpoint: its image declares no end
    assert (djl["end_of_patching"], djl["days_left"]) == (None, None)
    assert any("training.image_tag" in str(w) and "10 days left" in str(w) for w in warnings), warnings


def test_a_multi_model_image_without_a_fact_is_refused_naming_its_key() -> None:
    raw = copy.deepcopy(cdk_context()["environments"]["prod"])
    raw.setdefault("multi_model_endpoint", {})["djl_image"] = "djl-inference:0.99.0-cpu-full"
    with pytest.raises(SettingsError) as refused:
        check_images(parse_environment("prod", raw), EC2_END)
    assert str(refused.value) == (
        "environments.prod.multi_model_endpoint.djl_image: djl-inference:0.99.0-cpu-full has no end-of-patching "
        "fact in platform_facts/images.json; add it with its source."
    )


def test_the_image_table_is_read_with_each_training_images_runtime_and_a_bad_flavour_is_refused(tmp_path) -> None:
    import json as json_

    from platform_facts.images import image_facts

    entry = {"publisher": "AWS", "architecture": "x86_64", "end_of_patching": "2027-01-21", "checked": "2026-12-01",
             "source": "https://example.com/dlc", "replacement": "none"}  # fmt: skip
    table = tmp_path / "images.json"
    table.write_text(json_.dumps({"images": {
        "pytorch-training:9.9-ec2": {**entry, "training": {"platform": "ec2", "python": "3.13", "cuda": "13.0"}},
        "djl:1": {**entry, "end_of_patching": None}}}))  # fmt: skip
    facts = image_facts(table)
    runtime = facts["pytorch-training:9.9-ec2"].training
    assert runtime is not None and (runtime.platform, runtime.python, runtime.cuda, runtime.cuda_major) == (
        "ec2", "3.13", "13.0", 13)  # fmt: skip
    assert facts["djl:1"].training is None and facts["djl:1"].end_of_patching is None
    bad = tmp_path / "bad.json"
    bad.write_text(
        json_.dumps({"images": {"x:1": {**entry, "training": {"platform": "eks", "python": "3", "cuda": "1"}}}})
    )
    with pytest.raises(
        ValueError, match=r"images\.json: x:1: training\.platform must be one of \('ec2', 'sagemaker'\)"
    ):
        image_facts(bad)
