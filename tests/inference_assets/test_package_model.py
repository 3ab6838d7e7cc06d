"""The model.tar.gz layout the Graviton endpoint's Ray Serve image serves, its reproducibility, vendoring, upload."""

from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from inference_assets.tools import package_model
from inference_assets.tools.package_model import (
    PackagingError,
    build_model_archive,
    upload,
    vendor_dependencies,
)
from tests.inference_assets.fixture_wheels import build_wheelhouse

ELF_MACHINE_AARCH64 = 183
DJL_ENTRY = {"model.py": package_model.DJL_ENTRY_POINT}


def _members(archive: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(archive) as tar:
        return tar.getmembers()


def test_the_archive_is_ray_serves_model_package(model_archive: Path, tiny_model_dir: Path) -> None:
    """What the Graviton image serves (the Ray Serve DLC's contract): the model files and config.yaml +
    deployment.py at the root, the serving package (its launcher included) in code/, and nothing to install or of
    TorchServe's."""
    names = [member.name for member in _members(model_archive)]
    model_files = sorted(p.name for p in tiny_model_dir.iterdir())
    assert set(model_files) <= set(names)
    assert {"config.json", "model.safetensors", "tokenizer.json", "config.yaml", "deployment.py"} <= set(names)
    assert {
        "code/sentiment_serving/__init__.py",
        "code/sentiment_serving/predictor.py",
        "code/sentiment_serving/ray_server.py",
        "code/sentiment_serving/ray_deployment.py",
    } <= set(names)
    assert not [name for name in names if name.startswith(("code/lib/", "MAR-INF/"))]
    assert not {"code/requirements.txt", "code/inference.py"} & set(names)
    assert names == sorted(names)


def test_archive_code_is_the_repository_code(unpacked_model: Path) -> None:
    container = package_model.CONTAINER
    for shipped, source in (
        ("config.yaml", "config.yaml"),
        ("deployment.py", "deployment.py"),
    ):
        assert (unpacked_model / shipped).read_bytes() == (container / "entrypoints" / source).read_bytes()
    # Less the bytecode that tests importing the unpacked archive (the session's one copy) write beside it: the
    # archive's own members are listed by test_archive_contents.
    code = unpacked_model / "code/sentiment_serving"
    shipped = sorted(path.name for path in code.iterdir() if path.name != "__pycache__")
    assert shipped == sorted(package_model.SHARED_MODULES + package_model.SERVER_MODULES["ray"])
    for name in shipped:
        assert (unpacked_model / "code/sentiment_serving" / name).read_bytes() == (container / name).read_bytes()


def test_entries_carry_no_build_time_owner_or_host_mode(model_archive: Path) -> None:
    for member in _members(model_archive):
        assert member.isfile()
        assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (
            0,
            0,
            0,
            "",
            "",
        )
        assert member.mode == 0o644


def test_same_input_gives_the_same_bytes(tiny_model_dir: Path, model_archive: Path, tmp_path: Path) -> None:
    again = build_model_archive(tiny_model_dir, tmp_path / "elsewhere" / "other-name.tar.gz")
    assert again.read_bytes() == model_archive.read_bytes()
    header = model_archive.read_bytes()[:10]
    assert header[4:8] == b"\0\0\0\0", "gzip header must not carry a timestamp"
    assert not header[3] & 0x08, "gzip header must not carry the file name"


def test_extra_files_land_at_their_archive_paths(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_py = tmp_path / "model.py"
    model_py.write_text("print('djl')\n")
    archive = build_model_archive(
        tiny_model_dir,
        tmp_path / "model.tar.gz",
        extra_files={
            "serving.properties": b"engine=Python\n",
            "code/model.py": model_py,
        },
    )
    with tarfile.open(archive) as tar:
        assert tar.extractfile("serving.properties").read() == b"engine=Python\n"
        assert tar.extractfile("code/model.py").read() == model_py.read_bytes()


def test_a_djl_archive_carries_its_requirements_and_no_ray_serve_entry(tiny_model_dir: Path, tmp_path: Path) -> None:
    """For the multi-model endpoint (publish_models.build_archive): the serving package stays, Ray Serve's entry
    files go, and the dependencies travel as code/requirements.txt (or vendored in code/lib)."""
    every_entry = {"MAR-INF/MANIFEST.json", "code/inference.py", "config.yaml", "deployment.py"}
    archive = build_model_archive(tiny_model_dir, tmp_path / "model.tar.gz", server="djl")
    names = {member.name for member in _members(archive)}
    assert every_entry & names == set()
    assert {"config.json", "code/sentiment_serving/predictor.py", "code/requirements.txt"} <= names


def test_a_ray_archive_vendors_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    vendor = tmp_path / "lib"
    vendor.mkdir()
    (vendor / "sentiment_probe.py").write_text("")
    with pytest.raises(PackagingError, match="holds every dependency"):
        build_model_archive(tiny_model_dir, tmp_path / "model.tar.gz", vendor_dir=vendor)
    assert not (tmp_path / "model.tar.gz").exists()


@pytest.mark.parametrize(
    ("extra_files", "message"),
    [
        ({"../escape.txt": b"x"}, "relative file path"),
        ({"/abs.txt": b"x"}, "relative file path"),
        ({"config.json": b"{}"}, "would replace"),
        ({"code/sentiment_serving/predictor.py": b""}, "would replace"),
        ({"deployment.py": b""}, "would replace"),
        ({"notes.txt": Path("/nonexistent/notes.txt")}, "is not a file"),
    ],
)
def test_bad_extra_files_are_refused(tiny_model_dir: Path, tmp_path: Path, extra_files: dict, message: str) -> None:
    with pytest.raises(PackagingError, match=message):
        build_model_archive(tiny_model_dir, tmp_path / "model.tar.gz", extra_files=extra_files)
    assert not (tmp_path / "model.tar.gz").exists()


def test_a_directory_without_a_saved_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"0")
    with pytest.raises(PackagingError, match=r"no config\.json"):
        build_model_archive(tmp_path, tmp_path / "model.tar.gz")


def test_a_model_directory_with_its_own_code_folder_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes((tiny_model_dir / "config.json").read_bytes())
    (model / "code").mkdir()
    (model / "code" / "inference.py").write_text("")
    with pytest.raises(PackagingError, match=r"code/inference\.py"):
        build_model_archive(model, tmp_path / "model.tar.gz")


def test_vendored_packages_replace_requirements_and_go_first_on_sys_path(tiny_model_dir: Path, tmp_path: Path) -> None:
    # The toolkit pip-installs any code/requirements.txt at start-up, which would defeat vendoring (and need egress).
    vendor = tmp_path / "lib"
    vendor.mkdir()
    (vendor / "sentiment_probe.py").write_text("WHERE = __file__\n")
    archive = build_model_archive(
        tiny_model_dir, tmp_path / "model.tar.gz", vendor_dir=vendor, server="djl", extra_files=DJL_ENTRY
    )
    names = [member.name for member in _members(archive)]
    assert "code/lib/sentiment_probe.py" in names
    assert "code/requirements.txt" not in names

    unpacked = tmp_path / "unpacked"
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    code = unpacked / "code"
    # DJL puts only the model directory on sys.path; the archive's model.py adds code/ and code/lib.
    probe = "import sys, model, sentiment_probe; print(sys.path[0]); print(sentiment_probe.WHERE)"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=unpacked,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(unpacked)},
    )
    first_path, probe_file = result.stdout.split()
    assert first_path == str(code / "lib")
    assert probe_file == str(code / "lib" / "sentiment_probe.py")


def _locked() -> list[str]:
    lines = package_model.VENDOR_CONSTRAINTS.read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def test_vendoring_installs_aarch64_cp312_wheels_without_numpy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vendor_dependencies' real pip run, against a local wheelhouse (fixture_wheels.py) instead of PyPI: the same
    versions for x86_64 and CPython 3.11, and newer versions, sit beside the right ones."""
    wheelhouse = build_wheelhouse(tmp_path / "wheels", _locked())
    # pip reads its options from the environment too: no index, only the wheelhouse (and no user or site config).
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheelhouse))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    lib = vendor_dependencies(tmp_path / "lib")
    lock = (lib / package_model.VENDORED_LOCK).read_text().splitlines()
    required = [
        line.split("==")[0].replace("-", "_")
        for line in package_model.REQUIREMENTS.read_text().splitlines()
        if line and not line.startswith("#")
    ]
    pins = dict(line.split("==") for line in lock)
    assert set(required) <= set(pins), lock
    assert pins["transformers"] == "5.23.0"
    assert "numpy" not in pins and not (lib / "numpy").exists(), "numpy belongs to the image (torch's ABI)"
    assert not (lib / "bin").exists()
    for extension in [
        "tokenizers/tokenizers.abi3.so",
        "safetensors/_safetensors_rust.abi3.so",
    ]:
        elf = (lib / extension).read_bytes()[:20]
        assert elf[:4] == b"\x7fELF"
        assert int.from_bytes(elf[18:20], "little") == ELF_MACHINE_AARCH64, extension
    for compiled in lib.rglob("*.cpython-*.so"):
        assert "cpython-312-aarch64-linux-gnu" in compiled.name, compiled
    # The constraints file pins the whole closure: what was resolved is exactly what is locked.
    assert lock == _locked()


def test_upload_uses_sse_kms_and_returns_the_s3_uri(model_archive: Path) -> None:
    client = boto3.client(
        "s3",
        region_name="us-west-2",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    sent: list[dict] = []
    client.meta.events.register("provide-client-params.s3.PutObject", lambda params, **_: sent.append(params))
    key_arn = "arn:aws:kms:us-west-2:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    with Stubber(client) as stubber:
        stubber.add_response("put_object", {"ETag": '"abc"'})
        stubber.add_response("put_object", {"ETag": '"def"'})  # the digest beside it
        uri = upload(
            model_archive,
            "s3://artifacts-bucket/endpoints/sentiment/v2.tar.gz",
            kms_key_id=key_arn,
            s3_client=client,
        )
        stubber.assert_no_pending_responses()
    assert uri == "s3://artifacts-bucket/endpoints/sentiment/v2.tar.gz"
    params, digest = sent
    assert params["Bucket"] == "artifacts-bucket"
    assert params["Key"] == "endpoints/sentiment/v2.tar.gz"
    assert params["ServerSideEncryption"] == digest["ServerSideEncryption"] == "aws:kms"
    assert params["SSEKMSKeyId"] == digest["SSEKMSKeyId"] == key_arn
    # The SHA-256 the endpoint's model archive check compares before a deploy, as sha256sum writes it.
    assert digest["Key"] == "endpoints/sentiment/v2.tar.gz.sha256"
    expected = hashlib.sha256(model_archive.read_bytes()).hexdigest()
    body = digest["Body"]
    assert (body.getvalue() if hasattr(body, "getvalue") else body) == f"{expected}  {model_archive.name}\n".encode()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--upload", "s3://bucket/model.tar.gz"], "--upload needs --kms-key-id"),
        (
            ["--upload", "bucket/model.tar.gz", "--kms-key-id", "k"],
            "is not an S3 object URI",
        ),
    ],
)
def test_cli_refuses_bad_upload_arguments(
    model_archive: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    model_dir = tmp_path / "model"
    with tarfile.open(model_archive) as tar:
        tar.extractall(
            model_dir,
            filter="data",
            members=[m for m in tar.getmembers() if not m.name.startswith("code/")],
        )
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(
            package_model.main(
                [
                    "--model-dir",
                    str(model_dir),
                    "--output",
                    str(tmp_path / "m.tar.gz"),
                    *argv,
                ]
            )
        )
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "m.tar.gz").exists()


def test_cli_writes_the_archive(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert package_model.main(["--model-dir", str(tiny_model_dir), "--output", str(tmp_path / "m.tar.gz")]) == 0
    assert "wrote" in capsys.readouterr().out
    with (
        gzip.open(tmp_path / "m.tar.gz") as zipped,
        tarfile.open(fileobj=io.BytesIO(zipped.read())) as tar,
    ):
        assert tar.getmember("config.yaml").size > 0 and tar.getmember("deployment.py").size > 0
        assert "MAR-INF/MANIFEST.json" not in tar.getnames()


def test_a_model_dir_holding_ray_serves_entry_names_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for path in tiny_model_dir.iterdir():
        (model_dir / path.name).write_bytes(path.read_bytes())
    (model_dir / "config.yaml").write_text("applications: []\n")
    with pytest.raises(PackagingError, match=r"already holds config\.yaml"):
        build_model_archive(model_dir, tmp_path / "model.tar.gz")
