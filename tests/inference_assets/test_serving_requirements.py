"""The serving image's packages (inference_assets/container/ray_requirements.txt) are the versions the tests run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE_REQUIREMENTS = ROOT / "inference_assets" / "container" / "ray_requirements.txt"
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(?P<version>\S+)")


def pins(path: Path) -> dict[str, str]:
    """name -> version of every ``name==version`` line of a requirements file and the files it includes (-r)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            found.update(pins(path.parent / line[3:].strip()))
        elif match := _PIN.match(line):
            found[match["name"].lower().replace("_", "-")] = match["version"]
    return found


def test_every_image_package_is_pinned_as_the_tests_install_it() -> None:
    image, tests = pins(IMAGE_REQUIREMENTS), {**pins(ROOT / "requirements.txt"), **pins(ROOT / "requirements-dev.txt")}
    assert {"ray", "torch", "transformers", "tokenizers", "numpy", "pyyaml"} <= set(image)
    assert {name: version for name, version in image.items() if tests.get(name) != version} == {}


def test_the_image_requirements_name_no_unpinned_package() -> None:
    for line in IMAGE_REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        assert not line or line.startswith("-r ") or _PIN.match(line), line
