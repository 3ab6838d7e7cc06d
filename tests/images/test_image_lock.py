"""The serving image's lock (inference_assets/image/requirements.lock) is the image as tested: it agrees with the
requirements it was resolved from and with the versions the tests run, it is closed under the dependencies the
packages declare for linux aarch64 and Python 3.12, it holds no GPU library, and its wheels stay under the size
budget. The Dockerfile installs exactly it."""

from __future__ import annotations

import importlib.metadata
import json
import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from inference_assets.image.lock import LOCK, REQUIREMENTS, WHEELS, image_tags, marker_environment, parse_lock, pins

# The image's Python layer, compressed as the registry stores it, is about the sum of its wheels; the budget
# for the whole image is 1.5 GB, and the base (AL2023 with python3.12) takes well under 0.2 GB of it.
MAX_WHEEL_BYTES = 1_300_000_000
# Distributions that exist only for GPUs: NVIDIA's CUDA libraries and Python bindings, Triton (torch.compile's GPU
# code generator), and the CUDA/ROCm builds of frameworks.
GPU_PACKAGE = re.compile(r"^(nvidia-.*|cuda-.*|triton|pytorch-triton.*|cupy.*|.*-cu\d+.*|.*-rocm.*|jax-cuda.*)$")

LOCKED = parse_lock(LOCK.read_text())
TABLE = json.loads(WHEELS.read_text())


def closure(roots: dict[str, set[str]], requires: dict[str, list[str]]) -> set[str]:
    """Every distribution the roots need on the image's platform, following each one's declared requirements (with
    the extras asked of it) as ``requires`` gives them."""
    extras_of: dict[str, set[str]] = {}
    todo = list(roots.items())
    while todo:
        name, extras = todo.pop()
        known = extras_of.get(name)
        if known is not None and extras <= known:
            continue
        extras_of[name] = wanted = (known or set()) | extras
        for raw in requires.get(name, []):
            requirement = Requirement(raw)
            marker = requirement.marker
            if marker is None or any(marker.evaluate(marker_environment(extra)) for extra in {"", *wanted}):
                todo.append((canonicalize_name(requirement.name), set(requirement.extras)))
    return set(extras_of)


def _installed_requires(names: set[str]) -> dict[str, list[str]]:
    return {name: importlib.metadata.requires(name) or [] for name in names}


def _roots() -> dict[str, set[str]]:
    roots = {}
    for line in (REQUIREMENTS.read_text() + (REQUIREMENTS.parent / "requirements.txt").read_text()).splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-r "):
            requirement = Requirement(line)
            roots[canonicalize_name(requirement.name)] = set(requirement.extras)
    return roots


def test_the_lock_pins_what_the_requirements_ask_for() -> None:
    """Every pin of ray_requirements.txt (and requirements.txt, which it includes) is locked at its version; torch
    as PyTorch's CPU build of it."""
    asked = {name: version for name, (version, _) in pins(REQUIREMENTS).items()}
    locked = {name: LOCKED[name][0].split("+")[0] for name in asked if name in LOCKED}
    assert locked == asked
    assert LOCKED["torch"][0] == f"{asked['torch']}+cpu"


def test_every_locked_package_is_the_version_the_tests_run() -> None:
    """The tests run these packages at these versions (requirements-dev.txt's environment): the image runs nothing
    the tests have not seen; torch included (2.13.0+cpu: the same CPU build of the same release, x86 here)."""
    installed = {name: importlib.metadata.version(name) for name in LOCKED}
    differing = {name: (locked, installed[name]) for name, (locked, _) in LOCKED.items() if installed[name] != locked}
    assert differing == {}


def test_the_lock_is_closed_and_holds_nothing_unneeded() -> None:
    """The requirements' closure on linux aarch64 / Python 3.12, from the declared dependencies of the very versions
    locked (installed here at those versions), is exactly the lock: nothing missing (--no-deps would leave an import
    failing in the endpoint), nothing extra."""
    needed = closure(_roots(), _installed_requires(set(LOCKED)))
    assert needed - set(LOCKED) == set(), "missing from the lock"
    assert set(LOCKED) - needed == set(), "locked but needed by nothing"


def test_closure_follows_extras_and_platform_markers() -> None:
    """The closure above can fail: it follows an extra into its requirements and drops what the platform excludes."""
    requires = {
        "app": ["lib[fast]", "winonly; sys_platform == 'win32'", "old; python_version < '3.10'"],
        "lib": ["uvloop; extra == 'fast'", "core"],
        "uvloop": [],
        "core": [],
    }
    assert closure({"app": set()}, requires) == {"app", "lib", "uvloop", "core"}
    assert closure({"lib": set()}, requires) == {"lib", "core"}


def test_no_locked_package_is_a_gpu_library() -> None:
    assert [name for name in LOCKED if GPU_PACKAGE.match(name)] == []
    # The pattern catches what PyPI's aarch64 torch 2.13.0 wheel requires (its metadata, read 2026-12-06).
    cuda_build_needs = ["cuda-toolkit", "cuda-bindings", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "triton"]
    assert all(GPU_PACKAGE.match(name) for name in cuda_build_needs)
    # torch's own declared requirements, as locked, name none either (the CUDA build's would).
    assert not [raw for raw in importlib.metadata.requires("torch") or [] if GPU_PACKAGE.match(Requirement(raw).name)]


def test_each_package_is_one_wheel_for_the_image_platform_within_budget() -> None:
    """One hash per package, the wheel wheels.json names: built for CPython 3.12 on linux aarch64, the same version;
    their sizes add up to the image's Python layer, under the budget."""
    tags = set(image_tags())
    assert set(TABLE["wheels"]) == set(LOCKED)
    for name, (version, digests) in LOCKED.items():
        wheel = TABLE["wheels"][name]
        assert digests == [wheel["sha256"]], name
        wheel_name, wheel_version, _, wheel_tags = parse_wheel_filename(wheel["file"])
        assert (wheel_name, str(wheel_version)) == (name, version)
        assert wheel_tags & tags, f"{wheel['file']} does not run on CPython 3.12 linux aarch64"
    total = sum(wheel["bytes"] for wheel in TABLE["wheels"].values())
    assert total == TABLE["total_bytes"] < MAX_WHEEL_BYTES
    # The CUDA build alone would take a third of the budget (427,210,998 bytes before its CUDA libraries).
    assert TABLE["wheels"]["torch"]["file"].endswith("+cpu-cp312-cp312-manylinux_2_28_aarch64.whl")


@pytest.mark.parametrize("name", ["x86_64", "win_amd64", "macosx_14_0_arm64"])
def test_image_tags_refuse_other_platforms(name: str) -> None:
    assert not {tag for tag in image_tags() if tag.platform.endswith(name)}
