"""Synth refuses a container image past its publisher's end of patching (platform_facts/images.json).

An environment may run such an image only by accepting the risk in its settings with a reason
(``accept_unpatched_images``); the reason travels into the template metadata of the stack that runs the image, where
``pytorch-platform review`` shows it next to the days of patching left. Within ``WARN_DAYS`` of the end synth warns.
"today" is a parameter: ``cdk synth -c today=2027-01-15`` rehearses a future date, tests pass theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

import aws_cdk as cdk

from platform_facts.images import METADATA_KEY, WARN_DAYS, ImageFact, PatchStatus, UnknownImageError, image_fact
from stacks.settings import EnvironmentSettings, SettingsError

ACCEPT_KEY = "accept_unpatched_images"
# The platform's Graviton serving image (built by the pipeline, stacks/pipeline.py; run by stacks/graviton_endpoint.py):
# the weekly rebuild patches its base (the FROM of inference_assets/image/Dockerfile, a row of the table too) and its
# Python, not Ray (the lock's), so the image's window is the earliest of the three.
SERVING_IMAGE = "graviton-serving"
# The serving image's row of the table: its window is the earliest of its parts' (the OS, its Python, Ray), each with
# its source; the tag names the versions of those parts (tests/images checks them against the Dockerfile and the lock).
SERVING_IMAGE_FACT = "graviton-serving:ray-2.57.0-python-3.12-al2023"


@dataclass(frozen=True)
class ImageUse:
    stack: str  # construct id of the stack that runs the image inside the environment's stage
    setting: str  # the settings key that chooses it
    image: str  # repository:tag


@dataclass(frozen=True)
class CheckedImage:
    use: ImageUse
    fact: ImageFact
    accepted_risk: str | None

    def metadata(self) -> dict[str, Any]:
        end = self.fact.end_of_patching
        return {
            "image": self.use.image,
            "setting": self.use.setting,
            "architecture": self.fact.architecture,
            "publisher": self.fact.publisher,
            "end_of_patching": end.isoformat() if end else None,
            "source": self.fact.source,
            "checked": self.fact.checked.isoformat(),
            "replacement": self.fact.replacement,
            "accepted_risk": self.accepted_risk,
        }


def images_in_use(settings: EnvironmentSettings) -> list[ImageUse]:
    """The images the environment's enabled parts choose, with the key that chooses each."""
    training = settings.training
    uses = [
        # repository:tag from the image table: the table, not the tag, says which repository a DLC lives in.
        ImageUse("Training", "training.image_tag", training.image.image),
        ImageUse("Training", "training.remote_image_tag", training.remote_image.image),
    ]
    graviton = settings.graviton_endpoint
    if graviton.enabled:
        uses.append(ImageUse("GravitonEndpoint", f"images.{SERVING_IMAGE}", SERVING_IMAGE_FACT))
    mme = settings.multi_model_endpoint
    if mme.enabled:
        uses.append(ImageUse("MultiModelEndpoint", "multi_model_endpoint.djl_image", mme.djl_image))
    return uses


def check_images(settings: EnvironmentSettings, today: date) -> list[CheckedImage]:
    """Every image in use, checked on ``today``; SettingsError (one sentence) for an ended one without acceptance."""
    root = f"environments.{settings.name}"
    accepted = settings.accept_unpatched_images
    uses = images_in_use(settings)
    for image in accepted:
        if image not in {use.image for use in uses}:
            raise SettingsError(
                f"{root}.{ACCEPT_KEY}: accepts the risk of {image}, which no enabled setting of {settings.name} "
                "chooses; remove the entry so that a later choice of it is checked again."
            )
    checked = []
    for use in uses:
        try:
            fact = image_fact(use.image)
        except UnknownImageError as error:
            raise SettingsError(f"{root}.{use.setting}: {error.args[0]}.") from None
        if fact.status(today) is PatchStatus.ENDED and use.image not in accepted:
            raise SettingsError(
                f"{root}.{use.setting}: {use.image} ended patching on {fact.end_of_patching} ({fact.publisher}), so "
                f"it gets no security fixes; choose a patched image ({fact.replacement}) or accept the risk with "
                f'{root}.{ACCEPT_KEY}: {{"{use.image}": "<reason>"}}.'
            )
        checked.append(CheckedImage(use, fact, accepted.get(use.image)))
    return checked


def warning(image: CheckedImage, today: date) -> str | None:
    """What synth says about an image that ends within WARN_DAYS or has ended with the risk accepted."""
    fact, days = image.fact, image.fact.days_left(today)
    if days is None:
        return None
    if days < 0:
        return (
            f"{image.use.setting}: {image.use.image} ended patching on {fact.end_of_patching}; running it anyway "
            f"because {ACCEPT_KEY} says: {image.accepted_risk}"
        )
    if days <= WARN_DAYS:
        return (
            f"{image.use.setting}: {image.use.image} ends patching on {fact.end_of_patching} ({days} days left); "
            f"plan its replacement: {fact.replacement}"
        )
    return None


def record_images(stack: cdk.Stack, images: list[CheckedImage], today: date) -> None:
    """Write the images a stack runs into its template metadata, and warn about the ones ending or ended."""
    if not images:
        return
    stack.add_metadata(METADATA_KEY, [image.metadata() for image in images])
    for image in images:
        if (message := warning(image, today)) is not None:
            cdk.Annotations.of(stack).add_warning_v2(f"pytorch-platform:image-patching:{image.use.setting}", message)
