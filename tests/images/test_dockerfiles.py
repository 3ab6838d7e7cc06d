"""Every Dockerfile of the repository: hadolint finds nothing, every pip install reads only pinned requirements files
of the repository (the versions the tests run on), and the images the pipeline builds start from the bases the
platform's facts choose."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import aws_cdk as cdk
import pytest

from inference_assets.image.lock import LOCK, parse_lock
from inference_assets.local.local_server import SERVER_MODULE
from platform_facts.images import PatchStatus, image_fact, training_images
from stacks.components.image_builds import Architecture
from stacks.image_patching import SERVING_IMAGE_FACT
from stacks.pipeline import SERVING_IMAGE, TRAINING_IMAGE, platform_images, training_base
from tests.training_assets.test_container import HOST_ONLY

ROOT = Path(__file__).resolve().parents[2]
# The serving image's base: the Dockerfile's FROM, a row of platform_facts/images.json.
SERVING_IMAGE_BASE = "public.ecr.aws/amazonlinux/amazonlinux:2023"
HADOLINT = Path(sys.executable).parent / "hadolint"
TODAY = date(2026, 12, 5)


STACK = cdk.Stack(cdk.App(), "Images", env=cdk.Environment(account="999999999999", region="us-west-2"))
DEFINITIONS = {definition.name: definition for definition in platform_images(STACK, TODAY)}
# Dockerfile -> its build context: the pipeline's images, and the one each training node still builds itself
# (training_assets/instance/ec2_run.sh: docker build ... training_assets/instance/).
CONTEXTS = {
    **{ROOT / d.dockerfile: ROOT / d.context for d in DEFINITIONS.values()},  # type: ignore[attr-defined]
    ROOT / "training_assets/instance/Dockerfile": ROOT / "training_assets/instance",
}
DOCKERFILES = sorted(path for path in ROOT.glob("*_assets/**/Dockerfile"))


def test_every_dockerfile_has_a_known_context() -> None:
    assert DOCKERFILES and set(DOCKERFILES) == set(CONTEXTS)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    result = subprocess.run([str(HADOLINT), "--no-color", str(dockerfile)], capture_output=True, text=True, check=False)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_hadolint_reports_what_it_finds(tmp_path: Path) -> None:
    """The lint above can fail: the same binary and flags report a Dockerfile that changes directory with cd."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM public.ecr.aws/amazonlinux/amazonlinux:2023\nRUN cd /tmp && touch x\n")
    result = subprocess.run([str(HADOLINT), "--no-color", str(bad)], capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "DL3003" in result.stdout


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined, current = [], ""
    for line in dockerfile.read_text().splitlines():
        if line.strip().startswith("#") and not current:
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip():
            joined.append(current.strip())
        current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1] if " " in text else "") for text in joined]


def _pip_requirement_files(dockerfile: Path) -> list[Path]:
    """The repository files every ``pip install`` of ``dockerfile`` reads with -r/-c, found through the COPY
    instructions that put them where the RUN reads them (WORKDIR-relative); fails on a package named directly."""
    context = CONTEXTS[dockerfile]
    workdir, copied, files = "/", {}, []
    for instruction, arguments in _instructions(dockerfile):
        if instruction == "WORKDIR":
            workdir = arguments if arguments.startswith("/") else f"{workdir.rstrip('/')}/{arguments}"
        elif instruction == "COPY":
            *sources, destination = shlex.split(arguments)
            folder = destination in (".", "./") or destination.endswith("/") or len(sources) > 1
            target = destination if destination.startswith("/") else f"{workdir.rstrip('/')}/{destination}"
            target = target.rstrip("/").removesuffix("/.")
            for source in sources:
                copied[f"{target}/{Path(source).name}" if folder else target] = context / source
        elif instruction == "RUN":
            words_of_run = shlex.split(arguments)
            commands: list[list[str]] = [[]]
            for word in words_of_run:
                if word in ("&&", ";", "||"):
                    commands.append([])
                else:
                    commands[-1].append(word)
            for words in commands:
                if "pip" not in words or "install" not in words:
                    continue
                rest = words[words.index("install") + 1 :]
                while rest:
                    word = rest.pop(0)
                    if word in ("-r", "--requirement", "-c", "--constraint"):
                        name = rest.pop(0)
                        container_path = name if name.startswith("/") else f"{workdir.rstrip('/')}/{name}"
                        assert container_path in copied, f"{dockerfile}: {name} is not copied from the repository"
                        files.append(copied[container_path])
                    else:
                        assert word.startswith("-"), f"{dockerfile}: pip install names {word} instead of a pinned file"
    return files


PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[a-z0-9,]+\])?==([^=\s;]+)$")


def _with_included(path: Path) -> list[Path]:
    """``path`` and the requirements files it includes with -r (relative to it), depth first."""
    files = [path]
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith(("-r ", "--requirement ")):
            files += _with_included(path.parent / line.split(None, 1)[1])
    return files


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_pip_install_reads_pinned_files_of_the_repository(dockerfile: Path) -> None:
    files = _pip_requirement_files(dockerfile)
    assert files, f"{dockerfile} installs nothing with pip from a requirements file"
    for path in [included for read in files for included in _with_included(read)]:
        assert path.is_file() and ROOT in path.parents, path
        # A hashed lock's entry is "name==version \" with its "--hash=sha256:..." lines under it.
        lines = [line.strip().removesuffix("\\").strip() for line in path.read_text().splitlines()]
        requirements = [line for line in lines if line and not line.startswith(("#", "-r ", "--hash="))]
        assert requirements, path
        unpinned = [line for line in requirements if not PIN.match(line)]
        assert unpinned == [], f"{path.relative_to(ROOT)}: not pinned with ==: {unpinned}"


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if match := PIN.match(line.strip()):
            pins[re.sub(r"[-_.]+", "-", match[1].lower())] = match[2]
    return pins


def test_serving_image_installs_exactly_its_lock() -> None:
    """The image's Python packages are the lock and nothing else: every file by its hash, no dependency the lock does
    not name, no source build (tests/images/test_image_lock.py checks the lock against the requirements and the
    versions the tests run)."""
    dockerfile = ROOT / "inference_assets/image/Dockerfile"
    assert _pip_requirement_files(dockerfile) == [ROOT / "inference_assets/image/requirements.lock"]
    (install,) = [arguments for instruction, arguments in _instructions(dockerfile) if "pip install" in arguments]
    words = shlex.split(install)
    assert {"--require-hashes", "--no-deps", "--only-binary=:all:"} <= set(words)
    # torch's CPU build is on PyTorch's CPU index only; PyPI's aarch64 torch is the CUDA build.
    assert "--extra-index-url=https://download.pytorch.org/whl/cpu" in words
    check = words.index("check")
    assert words[check - 3 : check + 1] == ["python3.12", "-m", "pip", "check"]  # the installed set is consistent


def test_training_image_extends_the_dlc_the_facts_table_chooses() -> None:
    training = DEFINITIONS[TRAINING_IMAGE]
    assert training.architecture is Architecture.X86_64  # type: ignore[attr-defined]
    base = training_base(TODAY)
    # The EC2-flavour training DLC patched longest, the Amazon Linux 2023 one: the Ubuntu rows stay in the table as
    # history (with their replacement) and nothing chooses them.
    ec2 = training_images("ec2")
    assert base.training and base.training.platform == "ec2" and base in ec2
    assert base.end_of_patching == max(fact.end_of_patching for fact in ec2 if fact.end_of_patching)
    assert base.status(TODAY) is PatchStatus.PATCHED
    assert training.build_args["DLC_REPOSITORY"] == base.repository  # type: ignore[attr-defined]
    assert training.build_args["BASE_TAG"] == base.tag  # type: ignore[attr-defined]
    registry = STACK.resolve(training.build_args["DLC_REGISTRY"])  # type: ignore[attr-defined]
    assert registry == {"Fn::Join": ["", ["763104351884.dkr.ecr.us-west-2.", {"Ref": "AWS::URLSuffix"}]]}
    # The build may pull from exactly that repository of the DLC account.
    (dlc,) = training.base_registries  # type: ignore[attr-defined]
    assert dlc.repository == base.repository
    instructions = _instructions(ROOT / training.dockerfile)  # type: ignore[attr-defined]
    # No default in the Dockerfile: the table is the one place an image is chosen, with its repository.
    assert instructions[:4] == [("ARG", "DLC_REGISTRY"), ("ARG", "DLC_REPOSITORY"), ("ARG", "BASE_TAG"),
                                ("FROM", "${DLC_REGISTRY}/${DLC_REPOSITORY}:${BASE_TAG}")]  # fmt: skip
    # The same pinned file the EC2 nodes' image and the tests use, and the training package's modules.
    assert _pip_requirement_files(ROOT / training.dockerfile) == [ROOT / "training_assets/instance/requirements.txt"]  # type: ignore[attr-defined]
    copied = {word for instruction, arguments in instructions if instruction == "COPY" for word in arguments.split()}
    # Every module of the training package but those the host runs, as
    # tests/training_assets/test_container.py asks of the instance Dockerfile.
    modules = {p.name for p in (ROOT / "training_assets/instance").glob("*.py") if p.name not in HOST_ONLY}
    assert modules and {f"instance/{module}" for module in modules} <= copied


def test_training_image_refuses_a_base_past_its_end_of_patching() -> None:
    end = training_base(TODAY).end_of_patching
    assert end is not None
    with pytest.raises(Exception, match=rf"ended patching on {end}, so the training image would get no security"):
        training_base(end + timedelta(days=1))
    assert training_base(end) == training_base(TODAY)  # patched through its last day


def test_serving_image_is_arm64_on_the_patched_base_of_the_facts_table() -> None:
    serving = DEFINITIONS[SERVING_IMAGE]
    assert serving.architecture is Architecture.ARM64  # type: ignore[attr-defined]
    instructions = _instructions(ROOT / serving.dockerfile)  # type: ignore[attr-defined]
    # The base synth checks against its end of patching (stacks/image_patching.py) is the one the image starts from.
    assert instructions[0] == ("FROM", SERVING_IMAGE_BASE)
    assert image_fact(SERVING_IMAGE_BASE).status(TODAY) is PatchStatus.PATCHED
    # Patched at every build: the base moves to the newest AL2023 release before anything is installed.
    assert instructions[1][0] == "RUN" and instructions[1][1].startswith("dnf upgrade -y --releasever=latest")


def test_the_serving_images_row_names_what_the_image_holds() -> None:
    """The image table's serving row (synth checks the endpoint against it) names the Ray the lock installs, the
    Python the Dockerfile installs and the base it starts from; a bump of any of them without the row fails here."""
    fact = image_fact(SERVING_IMAGE_FACT)
    ray_version = parse_lock(LOCK.read_text())["ray"][0]
    dockerfile = (ROOT / DEFINITIONS[SERVING_IMAGE].dockerfile).read_text()  # type: ignore[attr-defined]
    assert fact.tag == f"ray-{ray_version}-python-3.12-al2023"
    assert "dnf install -y --setopt=install_weak_deps=False python3.12 " in dockerfile
    assert SERVING_IMAGE_BASE.endswith(":2023") and fact.architecture == "arm64"
    assert [part.part.split(" (")[0] for part in fact.parts] == [
        "Amazon Linux 2023",
        "Python 3.12",
        f"Ray {ray_version}",
    ]


def test_serving_image_starts_the_server_the_local_harness_starts() -> None:
    """The container's command is the archive's Ray Serve launcher with the archive's folders on PYTHONPATH, as
    LocalRayServer (which the serving tests run) starts it; no server of the TorchServe toolkit is left."""
    dockerfile = ROOT / DEFINITIONS[SERVING_IMAGE].dockerfile  # type: ignore[attr-defined]
    instructions = _instructions(dockerfile)
    entrypoint = json.loads(dict(instructions)["ENTRYPOINT"])
    assert entrypoint == ["python3.12", "-m", SERVER_MODULE]
    assert json.loads(dict(instructions)["CMD"]) == ["serve"]  # SageMaker's argument, which ray_server accepts
    environment = " ".join(arguments for instruction, arguments in instructions if instruction == "ENV")
    assert "PYTHONPATH=/opt/ml/model:/opt/ml/model/code" in environment.split()
    # Root, as SageMaker's contract for inference images asks ("Custom Inference Code with Hosting Services").
    assert "USER" not in dict(instructions)
    text = dockerfile.read_text().lower()
    assert "torchserve" not in text and "sagemaker_pytorch_serving_container" not in text and "java" not in text
