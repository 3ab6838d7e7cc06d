"""Every container image the platform deploys or builds on, with its publisher's end of patching (``images.json``).

One table that synth (stacks/image_patching.py), the ops review and the docs read: an image past its end of patching
gets no security fixes, so synth refuses it unless an environment accepts that risk with a written reason, and warns
``WARN_DAYS`` ahead. Dates are publisher facts with a source and the date they were checked; "today" is always passed
in, so the checks are testable at any date.

A training DLC's row also carries what its tag may not spell (``training``: EC2 or SageMaker flavour, Python, CUDA):
the settings choose a training image by tag and read its repository, CUDA and Python from here (stacks/settings/,
the image URIs and pull grants of the stacks, training_assets/remote_train.py's Python check).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Literal, cast, get_args

IMAGES_FILE = Path(__file__).with_name("images.json")
# The template metadata key under which a stack lists the images it runs (written at synth, read by the ops review).
METADATA_KEY = "PytorchPlatformImages"
# Warn this long before the end: time to pick, test and promote a replacement through dev, staging and prod.
WARN_DAYS = 60


class PatchStatus(StrEnum):
    PATCHED = "patched"
    ENDING = "ending"  # within WARN_DAYS of its end of patching
    ENDED = "ended"
    UNDECLARED = "no end declared"


# Where a training DLC runs: "ec2" is the flavour for docker run on EC2 (ECS, EKS), "sagemaker" the flavour SageMaker
# training jobs start (the SageMaker training toolkit and entry point); AWS publishes each version in both.
TrainingPlatform = Literal["ec2", "sagemaker"]


@dataclass(frozen=True)
class TrainingRuntime:
    """What a training DLC brings, from AWS's image data (images.json cites it): the Python the image runs (a
    ``@remote`` caller needs the same major.minor) and the CUDA version (which GPUs can run the image)."""

    platform: TrainingPlatform
    python: str  # major.minor, e.g. "3.12"
    cuda: str  # major.minor, e.g. "13.3"

    @property
    def cuda_major(self) -> int:
        return int(self.cuda.split(".")[0])


@dataclass(frozen=True)
class ImagePart:
    """A part of an image that ends support on its own (the OS, its Python, a framework), with its source: an image
    the platform builds is patched only as long as its earliest-ending part."""

    part: str
    end_of_patching: date | None  # None: the part's publisher declares no end
    source: str


@dataclass(frozen=True)
class ImageFact:
    image: str  # repository:tag
    publisher: str
    architecture: str  # x86_64 or arm64
    end_of_patching: date | None  # None: the publisher declares no end
    source: str
    checked: date
    replacement: str
    training: TrainingRuntime | None = None  # None: not a training DLC
    parts: tuple[ImagePart, ...] = ()  # an image the platform builds: what its window is made of

    @property
    def repository(self) -> str:
        return self.image.partition(":")[0]

    @property
    def tag(self) -> str:
        return self.image.partition(":")[2]

    def days_left(self, today: date) -> int | None:
        """Days of patching left on ``today`` (negative once ended), None when no end is declared."""
        return None if self.end_of_patching is None else (self.end_of_patching - today).days

    def status(self, today: date) -> PatchStatus:
        days = self.days_left(today)
        if days is None:
            return PatchStatus.UNDECLARED
        if days < 0:
            return PatchStatus.ENDED
        return PatchStatus.ENDING if days <= WARN_DAYS else PatchStatus.PATCHED


class UnknownImageError(KeyError):
    """An image without an entry in images.json: nobody has checked its end of patching."""


@cache
def image_facts(path: Path = IMAGES_FILE) -> dict[str, ImageFact]:
    raw = json.loads(path.read_text())["images"]
    return {
        image: ImageFact(
            image=image,
            publisher=entry["publisher"],
            architecture=entry["architecture"],
            end_of_patching=None if entry["end_of_patching"] is None else date.fromisoformat(entry["end_of_patching"]),
            source=entry["source"],
            checked=date.fromisoformat(entry["checked"]),
            replacement=entry["replacement"],
            training=_training_runtime(image, entry.get("training")),
            parts=_parts(image, entry),
        )
        for image, entry in raw.items()
    }


def _date(value: str | None) -> date | None:
    return None if value is None else date.fromisoformat(value)


def _parts(image: str, entry: dict) -> tuple[ImagePart, ...]:
    """An image's parts; its end of patching must be the earliest of theirs (one fact, not two to keep in step)."""
    parts = tuple(
        ImagePart(part["part"], _date(part["end_of_patching"]), part["source"]) for part in entry.get("parts", [])
    )
    ends = [part.end_of_patching for part in parts if part.end_of_patching is not None]
    if parts and (min(ends).isoformat() if ends else None) != entry["end_of_patching"]:
        raise ValueError(f"{IMAGES_FILE.name}: {image}: end_of_patching must be the earliest end of its parts")
    return parts


def _training_runtime(image: str, raw: dict[str, str] | None) -> TrainingRuntime | None:
    if raw is None:
        return None
    if raw["platform"] not in get_args(TrainingPlatform):
        raise ValueError(f"{IMAGES_FILE.name}: {image}: training.platform must be one of {get_args(TrainingPlatform)}")
    return TrainingRuntime(platform=cast(TrainingPlatform, raw["platform"]), python=raw["python"], cuda=raw["cuda"])


def image_fact(image: str) -> ImageFact:
    """The fact of ``repository:tag``; UnknownImageError names the file to add it to."""
    facts = image_facts()
    if image not in facts:
        raise UnknownImageError(
            f"{image} has no end-of-patching fact in platform_facts/{IMAGES_FILE.name}; add it with its source"
        )
    return facts[image]


def training_images(platform: TrainingPlatform) -> list[ImageFact]:
    """The training DLCs of ``platform`` in the table, ended ones included (an environment may accept one's risk)."""
    return [fact for fact in image_facts().values() if fact.training and fact.training.platform == platform]


def training_image(tag: str, platform: TrainingPlatform) -> ImageFact:
    """The training DLC of ``platform`` whose tag is ``tag``: the table, not the tag's spelling, says which repository
    it lives in and which Python and CUDA it runs. ValueError names the tags there are."""
    facts = [fact for fact in training_images(platform) if fact.tag == tag]
    if not facts:
        tags = ", ".join(fact.tag for fact in training_images(platform))
        raise ValueError(
            f"{tag} is no {platform} training image of platform_facts/{IMAGES_FILE.name}; use one of {tags} "
            "(or add the image there with its source)"
        )
    (fact,) = facts
    return fact


def fact_of_uri(uri: str) -> ImageFact | None:
    """The fact of an image URI (``<registry>/<repository>:<tag>`` as a job or a node pulls it), None when the table
    holds no such repository:tag (an image of the user's own)."""
    facts = image_facts()
    first, _, rest = uri.partition("/")
    # A registry host has a dot or a port (763104351884.dkr.ecr.us-west-2.amazonaws.com); a repository has neither.
    return facts.get(uri) or (facts.get(rest) if rest and ("." in first or ":" in first) else None)
