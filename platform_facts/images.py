"""Every container image the platform deploys or builds on, with its publisher's end of patching (``images.json``).

One table that synth (stacks/image_patching.py), the ops review and the docs read: an image past its end of patching
gets no security fixes, so synth refuses it unless an environment accepts that risk with a written reason, and warns
``WARN_DAYS`` ahead. Dates are publisher facts with a source and the date they were checked; "today" is always passed
in, so the checks are testable at any date.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from enum import StrEnum
from functools import cache
from pathlib import Path

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


@dataclass(frozen=True)
class ImageFact:
    image: str  # repository:tag
    publisher: str
    architecture: str  # x86_64 or arm64
    end_of_patching: date | None  # None: the publisher declares no end
    source: str
    checked: date
    replacement: str

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
        )
        for image, entry in raw.items()
    }


def image_fact(image: str) -> ImageFact:
    """The fact of ``repository:tag``; UnknownImageError names the file to add it to."""
    facts = image_facts()
    if image not in facts:
        raise UnknownImageError(
            f"{image} has no end-of-patching fact in platform_facts/{IMAGES_FILE.name}; add it with its source"
        )
    return facts[image]
