"""Lock the serving image's Python packages for the platform it runs on: linux aarch64 (Graviton), AL2023's Python 3.12.

    .venv/bin/python -m inference_assets.image.lock          # rewrite requirements.lock and wheels.json
    .venv/bin/python -m inference_assets.image.lock --check  # exit 1 if either would change

What the Dockerfile installs is exactly ``requirements.lock`` (``pip install --require-hashes --no-deps``): every
package of the image, one version each, one wheel each (its SHA-256). The resolver is uv (pinned in
requirements-dev.txt), told the image's platform (``--python-platform aarch64-manylinux_2_28 --python-version 3.12``),
so the lock holds what an aarch64 host gets, not what this x86 machine would. Inputs:

- ``container/ray_requirements.txt`` (and the ``requirements.txt`` it includes): the pins the image asks for;
- the versions installed where this runs (the test environment of ``requirements-dev.txt``) as constraints, so every
  package the image shares with the tests is the version the tests ran;
- torch from PyTorch's CPU wheel index, not PyPI: PyPI's linux aarch64 torch wheel is the CUDA build (its metadata
  requires cuda-toolkit, nvidia-cudnn-cu13, nvidia-nccl-cu13, nvidia-nvshmem-cu13, triton; 427 MB with a 430 MB
  libtorch_cuda.so). torch is a leaf of the image (nothing else in it requires torch), so the resolve runs without it
  plus the CPU wheel's own requirements (the installed torch's: the same ``+cpu`` build of the same version), and the
  torch line is the CPU wheel by its hash (``TORCH_CPU_WHEELS``).

``wheels.json`` records, per package, the one wheel an aarch64 CPython 3.12 installs (best tag first, as pip picks),
its SHA-256 (the lock keeps only that hash) and its size from the index: the image's Python layer, compressed,
is their sum (tests/images/test_image_lock.py keeps it under ``MAX_WHEEL_BYTES``). A new lock is a reviewed change:
run this, run the tests, commit both files.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

HERE = Path(__file__).resolve().parent
CONTAINER = HERE.parent / "container"
REQUIREMENTS = CONTAINER / "ray_requirements.txt"
LOCK = HERE / "requirements.lock"
WHEELS = HERE / "wheels.json"
PYTHON = (3, 12)  # AL2023's python3.12, the image's interpreter (Dockerfile)
UV_PLATFORM = "aarch64-manylinux_2_28"  # glibc 2.34 on AL2023: manylinux_2_28 wheels and older run
PYPI_SIMPLE = "https://pypi.org/simple"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# The CPU build of each torch version the image may lock, as PyTorch's CPU index lists it (file name: SHA-256, bytes).
# 2.13.0: the digest as published in PyTorch's index listing (https://download.pytorch.org/whl/cpu/torch/), recorded
# 2026-12-06 from public hash tables of that listing, whose cp311 x86_64 row equals the SHA-256 of the wheel this
# machine installs from the same index; the size as published with it. pip refuses any other file (--require-hashes).
TORCH_CPU_WHEELS = {
    "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_aarch64.whl": (
        "6f307c2c32d764ffc6ff6893b801fad6d4752f3e67966cb8abf1843427c02604",
        155_005_253,
    ),
}
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[(?P<extras>[^\]]*)\])?==(?P<version>[^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def image_tags() -> list[Tag]:
    """The wheel tags CPython 3.12 on linux aarch64 (glibc 2.34) accepts, best first (as pip orders them)."""
    manylinux = [f"manylinux_2_{minor}_aarch64" for minor in range(34, 16, -1)]
    platforms = [*manylinux, "manylinux2014_aarch64", "linux_aarch64"]
    return [*cpython_tags(PYTHON, platforms=platforms), *compatible_tags(PYTHON, "cp312", platforms=platforms)]


def pins(path: Path) -> dict[str, tuple[str, str]]:
    """Canonical name -> (version, the requirement line) of ``path`` and the files it includes with -r."""
    found: dict[str, tuple[str, str]] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            found.update(pins(path.parent / line[3:].strip()))
        elif match := _PIN.match(line):
            found[canonicalize_name(match["name"])] = (match["version"], line)
    return found


def parse_lock(text: str) -> dict[str, tuple[str, list[str]]]:
    """Canonical name -> (version, SHA-256 digests) of a hashed requirements file."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        if match := _PIN.match(line):
            current = canonicalize_name(match["name"])
            entries[current] = (match["version"], [])
        if current is not None:
            entries[current][1].extend(_HASH.findall(line))
    return entries


def torch_cpu_wheel(version: str) -> tuple[str, str, int]:
    """(file name, SHA-256, bytes) of torch ``version``'s CPU wheel for the image; the index's listing when it is
    reachable (and it must agree with the table), else the table."""
    name = f"torch-{version}+cpu-cp312-cp312-manylinux_2_28_aarch64.whl"
    if name not in TORCH_CPU_WHEELS:
        raise SystemExit(f"{name}: add its SHA-256 and size from {TORCH_CPU_INDEX}/torch/ to TORCH_CPU_WHEELS")
    digest, size = TORCH_CPU_WHEELS[name]
    try:
        listing = urllib.request.urlopen(f"{TORCH_CPU_INDEX}/torch/", timeout=20).read().decode()
    except OSError as error:
        print(f"{TORCH_CPU_INDEX} unreachable ({error}): torch's CPU wheel from TORCH_CPU_WHEELS", file=sys.stderr)
    else:
        listed = re.search(re.escape(name.replace("+", "%2B")) + r"#sha256=([0-9a-f]{64})", listing)
        if listed is None or listed[1] != digest:
            raise SystemExit(f"{name}: the index lists {listed and listed[1]}, TORCH_CPU_WHEELS {digest}")
    return name, digest, size


def resolve(requested: dict[str, tuple[str, str]], torch_version: str) -> str:
    """uv's lock of everything but torch, for the image's platform, constrained to the installed versions."""
    torch_needs = [
        str(requirement)
        for raw in importlib.metadata.requires("torch") or []
        if (requirement := Requirement(raw)).marker is None or requirement.marker.evaluate(marker_environment(""))
    ]
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    if (installed.get(canonicalize_name("torch")) or "").split("+")[0] != torch_version:
        raise SystemExit(f"run where torch {torch_version} is installed (its CPU build's requirements are read)")
    with tempfile.TemporaryDirectory() as folder:
        inputs, constraints = Path(folder, "in.txt"), Path(folder, "constraints.txt")
        inputs.write_text("\n".join([line for name, (_, line) in requested.items() if name != "torch"] + torch_needs))
        constraints.write_text(
            "\n".join(f"{name}=={version}" for name, version in sorted(installed.items()) if "+" not in version)
        )
        uv = str(Path(sys.executable).parent / "uv")
        command = [uv, "pip", "compile", str(inputs), "--constraint", str(constraints), "--quiet",
                   "--python-platform", UV_PLATFORM, "--python-version", "3.12",
                   "--generate-hashes", "--no-header", "--no-annotate", "--index-url", PYPI_SIMPLE]  # fmt: skip
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def marker_environment(extra: str) -> dict[str, str]:
    """PEP 508 marker values of the image's interpreter and platform."""
    return {"implementation_name": "cpython", "implementation_version": "3.12.12", "os_name": "posix",
            "platform_machine": "aarch64", "platform_python_implementation": "CPython", "platform_release": "",
            "platform_system": "Linux", "platform_version": "", "python_full_version": "3.12.12",
            "python_version": "3.12", "sys_platform": "linux", "extra": extra}  # fmt: skip


def wheel_of(name: str, version: str, digests: list[str]) -> dict[str, object]:
    """The wheel of ``name==version`` an aarch64 CPython 3.12 installs, from PyPI's JSON simple API."""
    accept = {"Accept": "application/vnd.pypi.simple.v1+json"}
    request = urllib.request.Request(f"{PYPI_SIMPLE}/{name}/", headers=accept)
    files = json.load(urllib.request.urlopen(request, timeout=60))["files"]
    ranked = {tag: rank for rank, tag in enumerate(image_tags())}
    candidates = []
    for entry in files:
        if not entry["filename"].endswith(".whl") or entry["hashes"].get("sha256") not in digests:
            continue
        _, wheel_version, _, tags = parse_wheel_filename(entry["filename"])
        best = min((ranked[tag] for tag in tags if tag in ranked), default=None)
        if str(wheel_version) == version and best is not None:
            candidates.append((best, entry))
    if not candidates:
        raise SystemExit(f"{name}=={version}: no wheel for CPython 3.12 on linux aarch64 (the image builds no sdist)")
    entry = min(candidates, key=lambda candidate: candidate[0])[1]
    return {"file": entry["filename"], "sha256": entry["hashes"]["sha256"], "bytes": entry["size"]}


def render(requested: dict[str, tuple[str, str]]) -> tuple[str, str]:
    torch_version = requested["torch"][0]
    locked = parse_lock(resolve(requested, torch_version))
    wheels = {name: wheel_of(name, version, digests) for name, (version, digests) in sorted(locked.items())}
    file, digest, size = torch_cpu_wheel(torch_version)
    wheels["torch"] = {"file": file, "sha256": digest, "bytes": size}
    versions = {name: version for name, (version, _) in locked.items()} | {"torch": f"{torch_version}+cpu"}
    lines = [
        "# The serving image's Python packages: linux aarch64, CPython 3.12, one wheel each. Generated by",
        "# `.venv/bin/python -m inference_assets.image.lock` (uv, for the image's platform, from",
        "# container/ray_requirements.txt; torch is PyTorch's CPU build); wheels.json says which file each hash is.",
        "# The Dockerfile installs exactly this: pip install --require-hashes --no-deps --only-binary :all:.",
    ]
    for name in sorted(versions):
        lines.append(f"{name}=={versions[name]} \\\n    --hash=sha256:{wheels[name]['sha256']}")
    total = sum(int(wheel["bytes"]) for wheel in wheels.values())  # type: ignore[call-overload]
    table = {"_what": "per package of requirements.lock: the wheel an aarch64 CPython 3.12 installs, its SHA-256 "
             "and its size in bytes from the index; total_bytes is their sum", "total_bytes": total,
             "wheels": dict(sorted(wheels.items()))}  # fmt: skip
    return "\n".join(lines) + "\n", json.dumps(table, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the files would change")
    args = parser.parse_args(argv)
    lock, table = render(pins(REQUIREMENTS))
    if args.check:
        stale = [path.name for path, text in ((LOCK, lock), (WHEELS, table)) if path.read_text() != text]
        print(f"stale: {', '.join(stale)}" if stale else "up to date")
        return 1 if stale else 0
    LOCK.write_text(lock)
    WHEELS.write_text(table)
    wheels = json.loads(table)
    print(f"{LOCK.name}: {len(wheels['wheels'])} packages, {wheels['total_bytes'] / 1e6:.0f} MB of wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
